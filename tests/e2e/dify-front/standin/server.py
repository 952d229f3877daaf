"""A stand-in for one of Dify's own services (their images cannot be pulled here): it answers every
request with the name of the service it stands in for, so a test sees which upstream nginx reached.
/db and /redis connect to PostgreSQL and Redis with the settings Dify's api gets."""
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def reply(self, payload):
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/db":
            import psycopg2
            with psycopg2.connect(host=os.environ["DB_HOST"], port=os.environ.get("DB_PORT", "5432"),
                                  user=os.environ["DB_USERNAME"], password=os.environ["DB_PASSWORD"],
                                  dbname=os.environ["DB_DATABASE"]) as conn, conn.cursor() as cur:
                cur.execute("SELECT current_database()")
                return self.reply({"service": os.environ["STANDS_IN_FOR"], "db": cur.fetchone()[0]})
        if self.path == "/redis":
            import redis
            client = redis.Redis(host=os.environ["REDIS_HOST"], password=os.environ["REDIS_PASSWORD"])
            return self.reply({"service": os.environ["STANDS_IN_FOR"], "redis": client.ping()})
        return self.reply({"service": os.environ["STANDS_IN_FOR"], "path": self.path})

    do_POST = do_GET

    def log_message(self, fmt, *args):
        pass


ThreadingHTTPServer((os.environ.get("HOST", "0.0.0.0"), int(os.environ["PORT"])), Handler).serve_forever()
