"""STAND-IN: waits for a signal and writes its name to /signals/got, then exits."""
import signal
import sys
import time


def got(number, _frame):
    with open("/signals/got", "w") as fh:
        fh.write(signal.Signals(number).name + "\n")
    sys.exit(0)


for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
    signal.signal(sig, got)
print("record: waiting for a signal", flush=True)
while True:
    time.sleep(1)
