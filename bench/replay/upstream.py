#!/usr/bin/env python3
"""bench/replay/upstream.py: a recorded-outcome upstream, an OpenAI-compatible HTTP server that
answers a chat completion from a replay workload (format: bench/replay/README.md).

It finds the request's `messages` in the workload (compared as JSON values: key order and
spacing do not matter) and answers with the recorded answer and usage of the tier its `model`
field names ("small" or "large": a key of the line's `outcomes`). Where several lines carry the
same messages, the first one's outcomes answer. An unknown prompt is a 400 and an unknown model a
404, both with an OpenAI error body. Non-streamed and streamed (SSE; the usage chunk when
stream_options.include_usage is set) answers. Standard library only; threaded; HTTP/1.1
keep-alive.

    python3 bench/replay/upstream.py --workload bench/replay/mmlu.jsonl [--port 0]

Once listening it prints exactly one line, `replay-upstream listening on PORT`.

Endpoints: POST /v1/chat/completions; GET /v1/models; GET /healthz; GET /replay/stats (calls
answered per tier, and errors).
"""

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def messages_key(messages):
    return json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def load_index(path):
    """messages key -> the line's outcomes (the first line with those messages)."""
    index = {}
    with open(path, encoding="utf-8") as f:
        for n, text in enumerate(f, 1):
            if not text.strip():
                continue
            ln = json.loads(text)
            index.setdefault(messages_key(ln["request"]["messages"]), ln["outcomes"])
    return index


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "replay-upstream/1"

    def log_message(self, fmt, *args):  # quiet: one line per request would swamp a bench
        pass

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, message, param=None, code=None, type_="invalid_request_error"):
        with self.server.lock:
            self.server.stats["errors"] += 1
        self.send_json(status, {"error": {"message": message, "type": type_, "param": param, "code": code}})

    def do_GET(self):
        if self.path == "/healthz":
            self.send_json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [
                {"id": t, "object": "model", "created": 0, "owned_by": "replay"} for t in ("small", "large")]})
        elif self.path == "/replay/stats":
            with self.server.lock:
                self.send_json(200, dict(self.server.stats, calls=dict(self.server.stats["calls"])))
        else:
            self.error(404, "no route %s" % self.path, code="not_found")

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self.error(404, "no route %s" % self.path, code="not_found")
        try:
            body = json.loads(raw)
            messages = body["messages"]
            model = body.get("model")
        except (ValueError, KeyError, TypeError):
            return self.error(400, "the body is not a chat completion request", code="invalid_body")
        outcomes = self.server.index.get(messages_key(messages))
        if outcomes is None:
            return self.error(400, "this prompt is not in the replay workload", param="messages",
                              code="unknown_prompt")
        if model not in outcomes:
            return self.error(404, "The model `%s` does not exist (the workload records %s)"
                              % (model, ", ".join(sorted(outcomes))), param="model", code="model_not_found")
        o = outcomes[model]
        usage = {"prompt_tokens": o["prompt_tokens"], "completion_tokens": o["completion_tokens"],
                 "total_tokens": o["prompt_tokens"] + o["completion_tokens"]}
        with self.server.lock:
            self.server.stats["calls"][model] = self.server.stats["calls"].get(model, 0) + 1
            cid = "chatcmpl-replay-%d" % sum(self.server.stats["calls"].values())
        created = int(time.time())
        if not body.get("stream"):
            return self.send_json(200, {
                "id": cid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": o["answer"]},
                             "logprobs": None, "finish_reason": "stop"}],
                "usage": usage})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
        events = [dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": o["answer"]},
                                       "logprobs": None, "finish_reason": None}]),
                  dict(base, choices=[{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}])]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(dict(base, choices=[], usage=usage))
        for ev in events:
            self.wfile.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    srv = ThreadingHTTPServer((a.host, a.port), Handler)
    srv.daemon_threads = True
    srv.index = load_index(a.workload)
    srv.lock = threading.Lock()
    srv.stats = {"calls": {}, "errors": 0}
    print("replay-upstream listening on %d" % srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
