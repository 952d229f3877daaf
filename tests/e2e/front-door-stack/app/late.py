"""STAND-IN for a server that starts to listen late (Dify's API while its import runs): NAME PORT
DELAY: after DELAY seconds it binds 0.0.0.0:PORT and answers every GET with {"service": NAME}."""
import http.server
import json
import sys
import time

name, port, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
time.sleep(delay)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"service": name}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


print(f"{name}: listening on {port} after {delay} s", flush=True)
http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()
