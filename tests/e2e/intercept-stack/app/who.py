"""A server that answers its own name (argv[1]) on every address of port argv[2] (8000 without it),
as an image's default server does: it binds 0.0.0.0 and is told nothing. With argv[3] `udp` it
also answers each datagram to that port with its name, to the sender (recvfrom, as UDP servers do)."""
import http.server
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


if sys.argv[3:] == ["udp"]:
    threading.Thread(target=answer_datagrams, daemon=True).start()
http.server.ThreadingHTTPServer(("0.0.0.0", PORT), Who).serve_forever()
