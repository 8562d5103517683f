#!/usr/bin/env python3
"""A small, real OpenAI-compatible upstream server used by the llmgw
integration tests and for manual experiments.

Standard library only.  Run:

    python3 tools/stub_upstream.py --port 0 --name alpha [--api-key KEY]
        [--tls-cert cert.pem --tls-key key.pem] [--chunk-delay 0.01]

Once listening it prints exactly one line, ``stub-upstream listening on PORT``.

Endpoints
---------
GET  /v1/models
POST /v1/chat/completions   (stream and non-stream)
POST /v1/completions        (stream and non-stream)
POST /v1/embeddings         (deterministic 8-dim vectors, float or base64)
GET  /stub/stats            counters, see Stats.snapshot()
GET  /stub/requests         the most recent requests this stub received
POST /stub/reset            zero the counters and forget recorded requests

Magic words in the last user message (chat) or the prompt (completions)
drive the tests.  Each may carry an ``@NAME`` suffix, in which case only the
stub started with ``--name NAME`` obeys it (so a fallback upstream that
receives the same message ignores it):

    stub:status=NNN   answer with HTTP status NNN and an OpenAI error body
    stub:sleep=S      sleep S seconds before answering
    stub:words=N      the reply is "[NAME]" followed by N words w1..wN
    stub:delay=S      per-request override of --chunk-delay
    stub:close        close the connection without answering
    stub:abort=N      (streams) send N chunks, then drop the connection mid-body
    stub:badutf8      the reply text ends in half a character (raw bytes F0 9F: not UTF-8)

The normal reply text is ``[NAME] echo: <last user message text>``.
"""

import argparse
import base64
import hashlib
import json
import re
import socket
import ssl
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAGIC_RE = re.compile(r"stub:(status|sleep|words|delay|close|abort|badutf8)(?:=([0-9.]+))?(?:@([A-Za-z0-9_.-]+))?")
EMBED_DIM = 8
# stub:badutf8 puts this in the reply text; the writers turn it into the raw bytes F0 9F.
BAD_UTF8_MARK = "<<BADUTF8>>"
MAX_RECORDED = 2000


# ---------------------------------------------------------------- helpers
# These are importable by the tests so expectations are computed one way.

def reply_text(name, user_text):
    """The assistant text the stub produces for a given user text."""
    magic = parse_magic(user_text, name)
    if "words" in magic:
        n = int(float(magic["words"]))
        return "[%s] " % name + " ".join("w%d" % i for i in range(1, n + 1))
    if "badutf8" in magic:
        return "[%s] echo: %s %s" % (name, user_text, BAD_UTF8_MARK)
    return "[%s] echo: %s" % (name, user_text)


def parse_magic(text, name):
    out = {}
    for m in MAGIC_RE.finditer(text or ""):
        key, val, target = m.group(1), m.group(2), m.group(3)
        if target is not None and target != name:
            continue
        out[key] = val if val is not None else True
    return out


def split_words(text):
    """One piece per word, trailing whitespace kept, so "".join() == text."""
    return re.findall(r"\S+\s*", text) or [text]


def count_words(text):
    return len((text or "").split())


def fake_embedding(item):
    """Deterministic unit-length vector of EMBED_DIM floats for an input item."""
    if not isinstance(item, str):
        item = json.dumps(item, separators=(",", ":"))
    digest = hashlib.sha256(item.encode("utf-8")).digest()
    raw = [(b - 127.5) / 127.5 for b in digest[:EMBED_DIM]]
    norm = sum(x * x for x in raw) ** 0.5 or 1.0
    # round-trip through float32 so float and base64 formats agree exactly
    return [struct.unpack("<f", struct.pack("<f", x / norm))[0] for x in raw]


def content_text(content):
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and p.get("type") == "text":
                parts.append(str(p.get("text", "")))
            elif isinstance(p, str):
                parts.append(p)
        return " ".join(parts)
    return str(content)


def last_user_text(messages):
    if not isinstance(messages, list):
        return ""
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            return content_text(m.get("content"))
    return ""


def all_messages_text(messages):
    if not isinstance(messages, list):
        return ""
    return " ".join(content_text(m.get("content")) for m in messages if isinstance(m, dict))


# ---------------------------------------------------------------- state

class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.requests = 0
        self.cancelled_streams = 0
        self.completed_streams = 0
        self.aborted_streams = 0
        self.active_streams = 0
        self.peak_active_streams = 0
        self.recorded = []

    def snapshot(self):
        with self.lock:
            return {
                "requests": self.requests,
                "cancelled_streams": self.cancelled_streams,
                "completed_streams": self.completed_streams,
                "aborted_streams": self.aborted_streams,
                "active_streams": self.active_streams,
                "peak_active_streams": self.peak_active_streams,
            }

    def record(self, entry):
        with self.lock:
            self.requests += 1
            self.recorded.append(entry)
            if len(self.recorded) > MAX_RECORDED:
                del self.recorded[: len(self.recorded) - MAX_RECORDED]

    def stream_started(self):
        with self.lock:
            self.active_streams += 1
            self.peak_active_streams = max(self.peak_active_streams, self.active_streams)

    def stream_ended(self, outcome):
        with self.lock:
            self.active_streams -= 1
            if outcome == "cancelled":
                self.cancelled_streams += 1
            elif outcome == "aborted":
                self.aborted_streams += 1
            else:
                self.completed_streams += 1


class ClientGone(Exception):
    pass


# ---------------------------------------------------------------- handler

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "stub-upstream/1"

    def version_string(self):
        return self.server_version

    # quiet by default; --verbose turns access logging on
    def log_message(self, fmt, *args):
        if self.server.verbose:
            sys.stderr.write("[%s] %s - %s\n" % (self.server.name, self.address_string(), fmt % args))

    # ---- low level output

    def send_json(self, status, obj, extra_headers=None):
        body = json.dumps(obj).encode("utf-8").replace(BAD_UTF8_MARK.encode(), b"\xf0\x9f")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra_headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def send_error_json(self, status, message, etype="invalid_request_error", param=None, code=None):
        self.send_json(status, {"error": {"message": message, "type": etype, "param": param, "code": code}})

    def write_chunk(self, data):
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, ssl.SSLError, OSError) as e:
            raise ClientGone(str(e))

    def peer_closed(self):
        """True if the peer has closed its side (EOF or reset is pending)."""
        sock = self.connection
        try:
            if isinstance(sock, ssl.SSLSocket):
                if sock.pending():
                    return False
                raw = socket.socket(fileno=sock.fileno())
                try:
                    return _eof_pending(raw)
                finally:
                    raw.detach()
            return _eof_pending(sock)
        except OSError:
            return True

    # ---- request plumbing

    def read_body(self):
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            chunks = []
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline(65537)
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def check_auth(self):
        key = self.server.api_key
        if not key:
            return True
        got = self.headers.get("Authorization") or ""
        if got == "Bearer " + key:
            return True
        self.send_error_json(401, "stub %s: invalid upstream API key" % self.server.name,
                             etype="invalid_request_error", code="invalid_api_key")
        return False

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/stub/stats":
            return self.send_json(200, self.server.stats.snapshot())
        if path == "/stub/requests":
            with self.server.stats.lock:
                recorded = list(self.server.stats.recorded)
            return self.send_json(200, {"requests": recorded})
        if path in ("/healthz", "/stub/healthz"):
            return self.send_json(200, {"ok": True, "name": self.server.name})
        if path == "/v1/models":
            self.record(path, None)
            if not self.check_auth():
                return
            now = int(time.time())
            data = [{"id": m, "object": "model", "created": now, "owned_by": "stub-" + self.server.name}
                    for m in ("stub-small", "stub-large", "stub-embed")]
            return self.send_json(200, {"object": "list", "data": data})
        self.send_error_json(404, "stub: no route for GET %s" % path, code="not_found")

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        try:
            raw = self.read_body()
        except (ValueError, OSError):
            self.close_connection = True
            return
        if path == "/stub/reset":
            with self.server.stats.lock:
                self.server.stats.reset()
            return self.send_json(200, {"ok": True})
        try:
            body = json.loads(raw.decode("utf-8")) if raw else {}
        except (UnicodeDecodeError, ValueError) as e:
            self.record(path, None, raw_error=str(e))
            return self.send_error_json(400, "stub: body is not valid JSON: %s" % e)
        if not isinstance(body, dict):
            self.record(path, None)
            return self.send_error_json(400, "stub: body must be a JSON object")
        self.record(path, body)
        if not self.check_auth():
            return
        if path == "/v1/chat/completions":
            return self.chat(body)
        if path == "/v1/completions":
            return self.completions(body)
        if path == "/v1/embeddings":
            return self.embeddings(body)
        self.send_error_json(404, "stub: no route for POST %s" % path, code="not_found")

    def record(self, path, body, raw_error=None):
        entry = {
            "t": time.time(),
            "method": self.command,
            "path": path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
        }
        if body is not None:
            entry["model"] = body.get("model")
            entry["stream"] = bool(body.get("stream"))
            if "messages" in body:
                entry["user_text"] = last_user_text(body.get("messages"))
            if "prompt" in body:
                entry["prompt"] = body.get("prompt")
            entry["body"] = body
        if raw_error:
            entry["raw_error"] = raw_error
        self.server.stats.record(entry)

    # ---- magic handling; returns True if the request was fully handled

    def apply_magic(self, text):
        magic = parse_magic(text, self.server.name)
        if "sleep" in magic:
            time.sleep(float(magic["sleep"]))
        if "close" in magic:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return magic, True
        if "status" in magic:
            status = int(float(magic["status"]))
            etype = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
                     429: "rate_limit_error"}.get(status, "server_error" if status >= 500 else "invalid_request_error")
            self.send_json(status, {"error": {
                "message": "stub %s: forced status %d" % (self.server.name, status),
                "type": etype, "param": None, "code": "stub_forced_%d" % status}},
                extra_headers={"Retry-After": "1"} if status in (429, 503) else None)
            return magic, True
        return magic, False

    # ---- endpoints

    def chat(self, body):
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return self.send_error_json(400, "stub: 'messages' must be a non-empty array", param="messages")
        user = last_user_text(messages)
        magic, handled = self.apply_magic(user)
        if handled:
            return
        name = self.server.name
        text = reply_text(name, user)
        model = body.get("model")
        created = int(time.time())
        cid = "chatcmpl-stub-%s-%d" % (name, self.server.next_id())
        fingerprint = "stub-" + name
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        tool_calls = None
        if tools:
            first = tools[0] if isinstance(tools[0], dict) else {}
            fname = (first.get("function") or {}).get("name") or first.get("name") or "unknown"
            tool_calls = [{"id": "call_stub_1", "type": "function",
                           "function": {"name": fname, "arguments": json.dumps({"tools_seen": len(tools)})}}]
        finish = "tool_calls" if tool_calls else "stop"
        usage = {"prompt_tokens": count_words(all_messages_text(messages)),
                 "completion_tokens": count_words(text)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]

        if not body.get("stream"):
            msg = {"role": "assistant", "content": text}
            if tool_calls:
                msg["tool_calls"] = tool_calls
            return self.send_json(200, {
                "id": cid, "object": "chat.completion", "created": created, "model": model,
                "system_fingerprint": fingerprint,
                "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}],
                "usage": usage,
            })

        def chunk(delta, finish_reason=None, choices=True, usage_obj=None):
            obj = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                   "system_fingerprint": fingerprint,
                   "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
                   if choices else []}
            if usage_obj is not None:
                obj["usage"] = usage_obj
            return obj

        events = []
        for i, piece in enumerate(split_words(text)):
            delta = {"content": piece}
            if i == 0:
                delta = {"role": "assistant", "content": piece}
            events.append(chunk(delta))
        if tool_calls:
            tc = dict(tool_calls[0])
            tc["index"] = 0
            events.append(chunk({"tool_calls": [tc]}))
        events.append(chunk({}, finish_reason=finish))
        opts = body.get("stream_options") or {}
        if isinstance(opts, dict) and opts.get("include_usage"):
            events.append(chunk(None, choices=False, usage_obj=usage))
        self.stream_events(events, magic)

    def completions(self, body):
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt_text = " ".join(p if isinstance(p, str) else json.dumps(p) for p in prompt)
        elif prompt is None:
            return self.send_error_json(400, "stub: 'prompt' is required", param="prompt")
        else:
            prompt_text = str(prompt)
        magic, handled = self.apply_magic(prompt_text)
        if handled:
            return
        name = self.server.name
        text = reply_text(name, prompt_text)
        model = body.get("model")
        created = int(time.time())
        cid = "cmpl-stub-%s-%d" % (name, self.server.next_id())
        usage = {"prompt_tokens": count_words(prompt_text), "completion_tokens": count_words(text)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if not body.get("stream"):
            return self.send_json(200, {
                "id": cid, "object": "text_completion", "created": created, "model": model,
                "system_fingerprint": "stub-" + name,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}],
                "usage": usage,
            })
        events = []
        pieces = split_words(text)
        for i, piece in enumerate(pieces):
            events.append({"id": cid, "object": "text_completion", "created": created, "model": model,
                           "system_fingerprint": "stub-" + name,
                           "choices": [{"index": 0, "text": piece, "logprobs": None,
                                        "finish_reason": "stop" if i == len(pieces) - 1 else None}]})
        opts = body.get("stream_options") or {}
        if isinstance(opts, dict) and opts.get("include_usage"):
            events.append({"id": cid, "object": "text_completion", "created": created, "model": model,
                           "choices": [], "usage": usage})
        self.stream_events(events, magic)

    def embeddings(self, body):
        inp = body.get("input")
        if inp is None:
            return self.send_error_json(400, "stub: 'input' is required", param="input")
        items = inp if isinstance(inp, list) and inp and not isinstance(inp[0], int) else [inp]
        first_text = items[0] if items and isinstance(items[0], str) else ""
        _, handled = self.apply_magic(first_text)
        if handled:
            return
        fmt = body.get("encoding_format") or "float"
        data = []
        for i, item in enumerate(items):
            vec = fake_embedding(item)
            if fmt == "base64":
                emb = base64.b64encode(struct.pack("<%df" % len(vec), *vec)).decode("ascii")
            else:
                emb = vec
            data.append({"object": "embedding", "index": i, "embedding": emb})
        tokens = sum(count_words(x) if isinstance(x, str) else len(x) if isinstance(x, list) else 1 for x in items)
        self.send_json(200, {"object": "list", "data": data, "model": body.get("model"),
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    # ---- SSE

    def stream_events(self, events, magic):
        delay = float(magic["delay"]) if "delay" in magic else self.server.chunk_delay
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        stats = self.server.stats
        abort_at = int(float(magic["abort"])) if "abort" in magic else None
        stats.stream_started()
        outcome = "cancelled"
        try:
            try:
                self.wfile.flush()
            except OSError as e:
                raise ClientGone(str(e))
            for i, ev in enumerate(events):
                if abort_at is not None and i >= abort_at:
                    outcome = "aborted"
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                if i and delay > 0:
                    time.sleep(delay)
                    if self.peer_closed():
                        raise ClientGone("peer closed")
                self.write_chunk(b"data: " + json.dumps(ev).encode("utf-8").replace(
                    BAD_UTF8_MARK.encode(), b"\xf0\x9f") + b"\n\n")
            if delay > 0:
                time.sleep(delay)
            self.write_chunk(b"data: [DONE]\n\n")
            self.write_chunk(b"")  # zero-length chunk terminates the body
            outcome = "completed"
        except ClientGone:
            self.close_connection = True
        finally:
            stats.stream_ended(outcome)


def _eof_pending(sock):
    """Non-blocking peek: True if the peer sent FIN/RST.  Data pending -> False."""
    import select
    r, _, _ = select.select([sock], [], [], 0)
    if not r:
        return False
    try:
        data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    return data == b""


# ---------------------------------------------------------------- server

class StubServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512

    def __init__(self, addr, name, api_key=None, chunk_delay=0.01, ssl_ctx=None, verbose=False):
        self.name = name
        self.api_key = api_key
        self.chunk_delay = chunk_delay
        self.ssl_ctx = ssl_ctx
        self.verbose = verbose
        self.stats = Stats()
        self._id_lock = threading.Lock()
        self._id = 0
        super().__init__(addr, Handler)

    def next_id(self):
        with self._id_lock:
            self._id += 1
            return self._id

    def finish_request(self, request, client_address):
        # TLS handshake happens here, in the per-connection thread, so a slow
        # or broken client cannot stall the accept loop.
        if self.ssl_ctx is None:
            return super().finish_request(request, client_address)
        try:
            request.settimeout(30)
            tls = self.ssl_ctx.wrap_socket(request, server_side=True)
            tls.settimeout(None)
        except (ssl.SSLError, OSError) as e:
            if self.verbose:
                sys.stderr.write("[%s] TLS handshake failed: %s\n" % (self.name, e))
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            try:
                tls.close()
            except OSError:
                pass

    def handle_error(self, request, client_address):
        if self.verbose:
            super().handle_error(request, client_address)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 = pick a free port")
    ap.add_argument("--name", default="stub")
    ap.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--chunk-delay", type=float, default=0.01, help="seconds between SSE chunks")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)

    ctx = None
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            ap.error("--tls-cert and --tls-key go together")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)

    srv = StubServer((args.host, args.port), args.name, api_key=args.api_key,
                     chunk_delay=args.chunk_delay, ssl_ctx=ctx, verbose=args.verbose)
    print("stub-upstream listening on %d" % srv.server_address[1], flush=True)
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
