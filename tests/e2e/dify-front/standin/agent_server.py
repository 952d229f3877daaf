"""A STAND-IN for Dify's agent server (langgenius/dify-agent-backend cannot be pulled here). It is
started the way Dify's image starts uvicorn (`--host ADDRESS --port PORT`) and applies at start the
check Dify's agent server applies to its settings: DIFY_AGENT_SERVER_SECRET_KEY, required when
DIFY_AGENT_STUB_API_BASE_URL is set, must be unpadded base64url text that decodes to exactly 32
bytes (dify-agent's decode_server_secret_key, langgenius/dify commit 2a3d0564b6f9; called by
ServerSettings.validate_server_secret_key, commit 07e7c7fd28b8). Requests other than /health need
`Authorization: Bearer DIFY_AGENT_API_TOKEN` (dify-agent/src/dify_agent/server/auth.py)."""
import argparse
import base64
import binascii
import hmac
import json
import os
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def check_server_secret_key(value: str) -> None:
    normalized = value.strip()
    if not normalized or not re.fullmatch(r"^[A-Za-z0-9_-]+$", normalized):
        raise ValueError("DIFY_AGENT_SERVER_SECRET_KEY must be valid unpadded base64url text")
    try:
        decoded = base64.b64decode(normalized + "=" * (-len(normalized) % 4), altchars=b"-_", validate=True)
    except binascii.Error as exc:
        raise ValueError("DIFY_AGENT_SERVER_SECRET_KEY must be valid unpadded base64url text") from exc
    if len(decoded) != 32:
        raise ValueError("DIFY_AGENT_SERVER_SECRET_KEY must decode to exactly 32 decoded bytes")


class Handler(BaseHTTPRequestHandler):
    def reply(self, status, payload):
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path != "/health":
            scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
            expected = os.environ.get("DIFY_AGENT_API_TOKEN", "").strip()
            if expected and (scheme.lower() != "bearer" or not token.strip()
                             or not hmac.compare_digest(token.strip().encode(), expected.encode())):
                return self.reply(401, {"detail": "invalid bearer token"})
        return self.reply(200, {"service": "agent_backend", "path": self.path})

    do_POST = do_GET

    def log_message(self, fmt, *args):
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    if os.environ.get("DIFY_AGENT_STUB_API_BASE_URL", "").strip():
        try:
            check_server_secret_key(os.environ.get("DIFY_AGENT_SERVER_SECRET_KEY", ""))
        except ValueError as exc:
            sys.exit(f"agent server settings: {exc}")
    print(f"agent server stand-in on {args.host}:{args.port}", flush=True)
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


main()
