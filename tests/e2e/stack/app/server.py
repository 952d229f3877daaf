"""The e2e stack's application, one file for every role:

  api     HTTP on $HOST:$PORT. POST /notes {"text": ...}: asks the model server for a completion,
          stores note + completion in PostgreSQL, counts in Redis, and queues a job for the worker.
          GET /notes: every note with its completion and the worker's result, and the Redis count.
  worker  takes jobs from Redis and writes a result row into PostgreSQL; also serves /health.
  init    creates the tables (a one-shot service the api waits for).
  health  the healthcheck: GET http://$HOST:$PORT/health (127.0.0.1 when $HOST is a wildcard).

It finds PostgreSQL and Redis through DATABASE_URL and REDIS_URL, or, like many programs, through
a host name alone (DB_HOST, REDIS_HOST) and the client library's default port. Without MODEL_URL
notes get no completion.
"""
import json
import os
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg2
import redis


def db():
    if "DATABASE_URL" in os.environ:
        return psycopg2.connect(os.environ["DATABASE_URL"])
    return psycopg2.connect(host=os.environ["DB_HOST"], user=os.environ["DB_USER"],
                            password=os.environ["DB_PASSWORD"], dbname=os.environ["DB_NAME"])


def cache():
    if "REDIS_URL" in os.environ:
        return redis.Redis.from_url(os.environ["REDIS_URL"])
    return redis.Redis(host=os.environ["REDIS_HOST"])


def complete(prompt):
    if "MODEL_URL" not in os.environ:
        return None
    body = json.dumps({"prompt": prompt, "n_predict": 8, "temperature": 0, "seed": 1}).encode()
    request = urllib.request.Request(os.environ["MODEL_URL"].rstrip("/").rsplit("/v1", 1)[0] + "/completion",
                                     data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        data = json.load(response)
    return {"content": data["content"], "tokens": data.get("tokens_predicted")}


class Handler(BaseHTTPRequestHandler):
    def reply(self, code, payload):
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (os.environ.get("ROLE"), fmt % args))

    def do_GET(self):
        if self.path == "/health":
            with db() as conn, conn.cursor() as cur:
                cur.execute("SELECT 1")
            cache().ping()
            return self.reply(200, {"ok": True, "role": os.environ.get("ROLE")})
        if self.path == "/notes" and os.environ.get("ROLE") == "api":
            with db() as conn, conn.cursor() as cur:
                cur.execute("SELECT n.id, n.text, n.completion, r.result FROM notes n "
                            "LEFT JOIN results r ON r.note_id = n.id ORDER BY n.id")
                rows = [{"id": i, "text": t, "completion": c, "result": r} for i, t, c, r in cur.fetchall()]
            return self.reply(200, {"notes": rows, "count": int(cache().get("notes") or 0)})
        return self.reply(404, {"error": "not found"})

    def do_POST(self):
        if self.path != "/notes" or os.environ.get("ROLE") != "api":
            return self.reply(404, {"error": "not found"})
        text = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["text"]
        completion = complete(text)
        with db() as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO notes (text, completion) VALUES (%s, %s) RETURNING id",
                        (text, json.dumps(completion)))
            note_id = cur.fetchone()[0]
        cache().incr("notes")
        cache().lpush("jobs", note_id)
        return self.reply(201, {"id": note_id, "completion": completion})


def work():
    r = cache()
    while True:
        job = r.brpop("jobs", timeout=5)
        if not job:
            continue
        note_id = int(job[1])
        with db() as conn, conn.cursor() as cur:
            cur.execute("SELECT text FROM notes WHERE id = %s", (note_id,))
            (text,) = cur.fetchone()
            cur.execute("INSERT INTO results (note_id, result) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                        (note_id, text.upper()))


def serve():
    server = ThreadingHTTPServer((os.environ.get("HOST", "0.0.0.0"), int(os.environ["PORT"])), Handler)
    print(f"{os.environ.get('ROLE')} listening on {server.server_address}", flush=True)
    server.serve_forever()


def main(role):
    if role == "init":
        for _ in range(30):
            try:
                conn = db()
                break
            except psycopg2.OperationalError:
                time.sleep(1)
        with conn, conn.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS notes (id serial PRIMARY KEY, text text, completion text)")
            cur.execute("CREATE TABLE IF NOT EXISTS results (note_id int PRIMARY KEY, result text)")
        print("init: tables ready", flush=True)
    elif role == "health":
        host = os.environ.get("HOST", "0.0.0.0")
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{os.environ['PORT']}/health"
        with urllib.request.urlopen(url, timeout=5) as response:
            sys.exit(0 if response.status == 200 else 1)
    elif role == "worker":
        threading.Thread(target=work, daemon=True).start()
        serve()
    elif role == "api":
        serve()
    else:
        sys.exit(f"unknown role {role}")


if __name__ == "__main__":
    main(sys.argv[1])
