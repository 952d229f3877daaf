"""Prints what the Dockerfile set up (ENV, a file made by RUN, WORKDIR), then stays up."""
import os
import pathlib
import time

print(os.environ["GREETING"], pathlib.Path("built.txt").read_text().strip(), os.getcwd(), flush=True)
time.sleep(3600)
