#!/usr/bin/env python3
"""Load generator for any OpenAI-compatible server (vLLM, llama-server, ...): streams chat
completions at each concurrency of a sweep and prints, per level, output tokens/s (all requests
together), time to first token and request latency (p50/p99), so flag sets can be compared on the
same nodes. Standard library only.

    python3 bench/serve.py --base-url http://NODE:8000/v1 --concurrency 1,4,16 --max-tokens 128

The API key, if the server wants one, is read from $OPENAI_API_KEY (never a command-line argument).
Tokens are the server's `usage.completion_tokens` when it reports them, else one per streamed chunk.
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional
from urllib.parse import urlsplit

PROMPT = ("You are benchmarking a language model server. Write a short story about a lighthouse keeper "
          "who finds a message in a bottle. ")


class Endpoint:
    def __init__(self, base_url: str, api_key: Optional[str], timeout: float):
        url = urlsplit(base_url.rstrip("/"))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise SystemExit(f"serve.py: --base-url {base_url!r}: expected http(s)://HOST:PORT/v1")
        self.https, self.host, self.port = url.scheme == "https", url.hostname, url.port
        self.path, self.timeout = url.path, timeout
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def first_model(self) -> str:
        conn = self.connect()
        conn.request("GET", self.path + "/models", headers=self.headers)
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise SystemExit(f"serve.py: GET {self.path}/models: HTTP {response.status}")
        return json.loads(body)["data"][0]["id"]

    def stream(self, model: str, prompt: str, max_tokens: int) -> Dict[str, float]:
        """One streamed chat completion: its latency, time to first token and output tokens."""
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}],
                           "max_tokens": max_tokens, "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}})
        start = time.perf_counter()
        conn = self.connect()
        try:
            conn.request("POST", self.path + "/chat/completions", body=body, headers=self.headers)
            response = conn.getresponse()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {response.read()[:200]!r}")
            first, chunks, usage = None, 0, None
            for raw in response:  # server-sent events, one `data: {...}` line per chunk
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if event.get("usage"):
                    usage = event["usage"].get("completion_tokens")
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if delta.get("content") or delta.get("reasoning_content"):
                        chunks += 1
                        if first is None:
                            first = time.perf_counter() - start
            end = time.perf_counter() - start
        finally:
            conn.close()
        return {"latency": end, "ttft": first if first is not None else end, "tokens": usage or chunks}


def percentile(values: List[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def run_level(endpoint: Endpoint, model: str, concurrency: int, requests: int, max_tokens: int,
              prompt: str) -> Dict[str, float]:
    results, errors, lock = [], [], threading.Lock()

    def one(i: int) -> None:
        try:
            result = endpoint.stream(model, f"{prompt}(request {i})", max_tokens)
            with lock:
                results.append(result)
        except Exception as exc:  # a failed request is counted and reported, not fatal
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}")

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, range(requests)))
    wall = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in results)
    return {"concurrency": concurrency, "requests": len(results), "errors": len(errors),
            "first_error": errors[0] if errors else "", "wall_s": wall,
            "tokens_per_s": tokens / wall if wall else 0.0,
            "tokens_per_request": statistics.mean(r["tokens"] for r in results) if results else 0.0,
            "ttft_p50_ms": 1000 * percentile([r["ttft"] for r in results], 0.5),
            "ttft_p99_ms": 1000 * percentile([r["ttft"] for r in results], 0.99),
            "latency_p50_ms": 1000 * percentile([r["latency"] for r in results], 0.5),
            "latency_p99_ms": 1000 * percentile([r["latency"] for r in results], 0.99)}


def table(rows: List[Dict[str, float]]) -> str:
    head = ("conc", "reqs", "errs", "out tok/s", "tok/req", "TTFT p50 ms", "TTFT p99 ms", "lat p50 ms", "lat p99 ms")
    keys = ("concurrency", "requests", "errors", "tokens_per_s", "tokens_per_request", "ttft_p50_ms", "ttft_p99_ms",
            "latency_p50_ms", "latency_p99_ms")
    cells = [head] + [tuple(f"{r[k]:.1f}" if isinstance(r[k], float) else str(r[k]) for k in keys) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", help="model name (default: the first of GET /models)")
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma-separated levels (default 1,2,4,8)")
    parser.add_argument("--requests", type=int, default=0, help="requests per level (default 4 x concurrency)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt-repeat", type=int, default=1, help="repeat the prompt N times (longer prefill)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per request")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        parser.error(f"--concurrency {args.concurrency!r}: expected numbers such as 1,4,16")
    if not levels or min(levels) < 1:
        parser.error("--concurrency: levels are positive integers")
    endpoint = Endpoint(args.base_url, os.environ.get("OPENAI_API_KEY"), args.timeout)
    model = args.model or endpoint.first_model()
    prompt = PROMPT * max(1, args.prompt_repeat)
    endpoint.stream(model, prompt, 4)  # warm-up, not counted
    rows = []
    for level in levels:
        rows.append(run_level(endpoint, model, level, args.requests or 4 * level, args.max_tokens, prompt))
        if rows[-1]["errors"]:
            print(f"serve.py: concurrency {level}: {rows[-1]['errors']} failed requests, "
                  f"first: {rows[-1]['first_error']}", file=sys.stderr)
    if args.json:
        print(json.dumps({"model": model, "base_url": args.base_url, "max_tokens": args.max_tokens, "rows": rows},
                         indent=2))
    else:
        print(f"model {model} at {args.base_url}, max_tokens {args.max_tokens}")
        print(table(rows))
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
