"""A server that answers its own name (argv[1]) on every address of port argv[2], as an image's
default server does: it binds 0.0.0.0 and is told nothing."""
import http.server
import sys

NAME, PORT = sys.argv[1], int(sys.argv[2])


class Who(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"I am {NAME}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("0.0.0.0", PORT), Who).serve_forever()
