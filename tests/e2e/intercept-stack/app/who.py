"""A server that answers its own name (argv[1]) on every address of port argv[2] (8000 without it),
as an image's default server does: it binds 0.0.0.0 and is told nothing. With `udp` among the
later arguments it also answers each datagram to that port with its name, to the sender (recvfrom,
as UDP servers do); with `udp-read`, each datagram to the port after it, read with read() (as Go's
UDPConn.Read does: nothing says the sender), to the HOST:PORT the datagram names."""
import http.server
import os
import socket
import sys
import threading

NAME = sys.argv[1]
PORT = int(sys.argv[2]) if len(sys.argv) > 2 else 8000


class Who(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"I am {NAME}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def answer_datagrams():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", PORT))
    while True:
        _, sender = s.recvfrom(512)
        s.sendto(f"I am {NAME}".encode(), sender)


def answer_read_datagrams():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", PORT + 1))
    while True:
        host, port = os.read(s.fileno(), 512).decode().split()[1].rsplit(":", 1)
        s.sendto(f"I am {NAME}".encode(), (host, int(port)))


if "udp" in sys.argv[3:]:
    threading.Thread(target=answer_datagrams, daemon=True).start()
if "udp-read" in sys.argv[3:]:
    threading.Thread(target=answer_read_datagrams, daemon=True).start()
http.server.ThreadingHTTPServer(("0.0.0.0", PORT), Who).serve_forever()
