"""The fault-injection stack's program, one file for every role:

  counter         adds 1 to the number in /data/counter every ~100 ms, written whole: a file of its
                  own, fsync'ed, renamed over the old one (a reader, or a kill at any moment, sees the
                  old number or the new one, never a part). A file it cannot read is an error.
  counter-health  healthy while /data/counter changed in the last 3 s.
  web             HTTP on $HOST:$PORT: /health answers once Redis ($REDIS_HOST) answers PING and the
                  counter reads; its body is the counter.
  web-health      GET http://$HOST:$PORT/health (127.0.0.1 where $HOST is a wildcard).
"""
import os
import socket
import sys
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COUNTER = "/data/counter"


def read_counter():
    try:
        with open(COUNTER) as f:
            text = f.read()
    except FileNotFoundError:
        return 0
    return int(text)  # a file cut short or empty raises: the counter stops, and says why


def count():
    value = read_counter()
    print(f"counter: starting at {value}", flush=True)
    while True:
        value += 1
        partial = f"{COUNTER}.{os.getpid()}"
        with open(partial, "w") as f:
            f.write(f"{value}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, COUNTER)
        time.sleep(0.1)


def redis_ping():
    with socket.create_connection((os.environ["REDIS_HOST"], 6379), timeout=2) as s:
        s.sendall(b"PING\r\n")
        return s.recv(64).startswith(b"+PONG")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/health" and redis_ping()
        body = f"{read_counter()}\n".encode()
        self.send_response(200 if ok else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        pass


def main(role):
    host = os.environ.get("HOST", "0.0.0.0")
    if role == "counter":
        count()
    elif role == "counter-health":
        sys.exit(0 if time.time() - os.stat(COUNTER).st_mtime < 3 else 1)
    elif role == "web":
        ThreadingHTTPServer((host, int(os.environ["PORT"])), Handler).serve_forever()
    elif role == "web-health":
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{os.environ['PORT']}/health"
        with urllib.request.urlopen(url, timeout=5) as response:
            sys.exit(0 if response.status == 200 else 1)
    else:
        sys.exit(f"unknown role {role}")


if __name__ == "__main__":
    main(sys.argv[1])
