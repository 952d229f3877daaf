// A minimal web front end: serves a page and forwards /v1/* to the API.
const http = require("http");
const api = new URL(process.env.API_URL || "http://api:8000/v1");
http.createServer((req, res) => {
  if (req.url === "/healthz") { res.end("ok"); return; }
  if (req.url.startsWith("/v1/")) {
    const upstream = http.request({ host: api.hostname, port: api.port, path: req.url, method: req.method,
                                    headers: req.headers }, (r) => { res.writeHead(r.statusCode, r.headers); r.pipe(res); });
    upstream.on("error", () => { res.writeHead(502); res.end(); });
    req.pipe(upstream);
    return;
  }
  res.setHeader("content-type", "text/html");
  res.end("<!doctype html><title>chat</title><h1>chat</h1>");
}).listen(Number(process.env.PORT || 3000), process.env.HOST || "0.0.0.0");
