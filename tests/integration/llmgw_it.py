"""Shared machinery for the llmgw real-process integration tests.

Everything here runs as separate OS processes on loopback with free ports:
stub upstreams (tools/stub_upstream.py) and the llmgw binary
(env LLMGW_BIN, default build/gateway/llmgw).  The official `openai` SDK is
the client.
"""

import importlib.util
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

try:  # the SDK in this environment is built on httpx2; older ones use httpx (re-exported for tests)
    import httpx2 as httpx  # noqa: F401
except ImportError:  # pragma: no cover
    import httpx  # type: ignore  # noqa: F401

import openai

ROOT = Path(__file__).resolve().parents[2]
STUB_SCRIPT = ROOT / "tools" / "stub_upstream.py"
LLMGW_BIN = Path(os.environ.get("LLMGW_BIN") or ROOT / "build" / "gateway" / "llmgw")
if not LLMGW_BIN.is_absolute():
    LLMGW_BIN = (ROOT / LLMGW_BIN).resolve()

STARTUP_TIMEOUT = 15.0

# The model engine tiers serve in the tests (scripts/fetch-models puts it there).
ENGINE_MODEL = Path(os.environ.get("LLMGW_ENGINE_MODEL") or ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")

# limits used by the shared test gateway (tests rely on these values)
REQUEST_TIMEOUT_MS = 1000
MAX_BODY_BYTES = 65536
MAX_HEADER_BYTES = 8192

# The stub's own helpers compute expected replies, so there is one definition.
_spec = importlib.util.spec_from_file_location("stub_upstream", STUB_SCRIPT)
stub_upstream = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stub_upstream)

_running_gateways = []
_counter = itertools.count(1)


def uniq(prefix="m"):
    """A marker unique within this test run, for finding a request in a stub's log."""
    return "%s%d-%s" % (prefix, next(_counter), uuid.uuid4().hex[:8])


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout, interval=0.02, what="condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError("timed out after %.1fs waiting for %s (last=%r)" % (timeout, what, last))


def tail(path, n=60):
    try:
        with open(path, "r", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return "<no log: %s>" % e


# ------------------------------------------------------------------ YAML

_PLAIN_RE = re.compile(r"^[A-Za-z0-9_./][A-Za-z0-9_./:@+-]*$")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "~", "y", "n"}


def _scalar(v):
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v)
    if (_PLAIN_RE.match(s) and s.lower() not in _RESERVED and not re.match(r"^[0-9.+-]+$", s)
            and not s.endswith(":") and ": " not in s):
        return s
    return json.dumps(s)  # a JSON string is a valid YAML double-quoted scalar


def _emit(obj, ind, out):
    pad = " " * ind
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, (dict, list)) and v:
                out.append("%s%s:" % (pad, k))
                _emit(v, ind + 2, out)
            elif isinstance(v, (dict, list)):
                out.append("%s%s: %s" % (pad, k, "{}" if isinstance(v, dict) else "[]"))
            else:
                out.append("%s%s: %s" % (pad, k, _scalar(v)))
    elif isinstance(obj, list):
        for item in obj:
            if isinstance(item, (dict, list)) and item:
                sub = []
                _emit(item, ind + 2, sub)
                sub[0] = pad + "- " + sub[0][ind + 2:]
                out.extend(sub)
            else:
                out.append("%s- %s" % (pad, _scalar(item)))
    else:
        out.append(pad + _scalar(obj))


def to_yaml(obj):
    out = ["# written by tests/integration/llmgw_it.py"]
    _emit(obj, 0, out)
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ processes

def _read_port_line(proc, timeout, what):
    result = {}

    def reader():
        result["line"] = proc.stdout.readline()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    line = result.get("line") or ""
    m = re.match(r"stub-upstream listening on (\d+)", line)
    if not m:
        proc.kill()
        raise RuntimeError("%s did not report its port (got %r, rc=%r)" % (what, line, proc.poll()))
    return int(m.group(1))


class Stub:
    """A tools/stub_upstream.py process."""

    def __init__(self, workdir, name, api_key=None, tls=None, chunk_delay=0.01):
        self.name = name
        self.api_key = api_key
        self.tls = tls  # (cert, key) or None
        self.log_path = Path(workdir) / ("stub-%s.log" % name)
        cmd = [sys.executable, str(STUB_SCRIPT), "--port", "0", "--name", name,
               "--chunk-delay", str(chunk_delay)]
        if api_key:
            cmd += ["--api-key", api_key]
        if tls:
            cmd += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self.port = _read_port_line(self.proc, 10, "stub %s" % name)

    @property
    def scheme(self):
        return "https" if self.tls else "http"

    @property
    def base_url(self):
        return "%s://127.0.0.1:%d/v1" % (self.scheme, self.port)

    def _get(self, path):
        r = requests.get("%s://127.0.0.1:%d%s" % (self.scheme, self.port, path), timeout=5,
                         verify=str(self.tls[0]) if self.tls else True)
        r.raise_for_status()
        return r.json()

    def stats(self):
        return self._get("/stub/stats")

    def recorded(self):
        return self._get("/stub/requests")["requests"]

    def requests_with(self, marker):
        """Recorded requests whose user text / prompt / input mentions marker."""
        out = []
        for r in self.recorded():
            hay = json.dumps([r.get("user_text"), r.get("prompt"), (r.get("body") or {}).get("input")])
            if marker in hay:
                out.append(r)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


class Gateway:
    """An llmgw process with a generated config."""

    def __init__(self, workdir, config, dev_tls=True, env=None):
        self.env = dict(os.environ, **env) if env else None   # extra environment variables
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.config_path = self.dir / "llmgw.yaml"
        self.config_path.write_text(to_yaml(config))
        self.tls_dir = self.dir / "tls"
        self.log_path = self.dir / "llmgw.log"
        self.dev_tls = dev_tls
        self.proc = None
        self.http_port = None
        self.https_port = None
        for entry in config.get("listen", []):
            port = int(str(entry["address"]).rsplit(":", 1)[1])
            if entry.get("tls"):
                self.https_port = self.https_port or port
            else:
                self.http_port = self.http_port or port

    # urls
    @property
    def http(self):
        return "http://127.0.0.1:%d" % self.http_port

    @property
    def https(self):
        return "https://127.0.0.1:%d" % self.https_port

    @property
    def cert(self):
        return self.tls_dir / "cert.pem"

    def start(self):
        if not LLMGW_BIN.exists():
            pytest.fail("llmgw binary not found at %s -- build it with "
                        "`cmake -S . -B build && cmake --build build -j2` or set LLMGW_BIN" % LLMGW_BIN,
                        pytrace=False)
        cmd = [str(LLMGW_BIN), "-c", str(self.config_path)]
        if self.dev_tls:
            cmd += ["--dev-tls", str(self.tls_dir)]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(self.dir),
                                     env=self.env)
        _running_gateways.append(self)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("llmgw exited during startup with rc=%s; cmd=%s\nconfig:\n%s\nlog:\n%s"
                                     % (self.proc.returncode, cmd, self.config_path.read_text(),
                                        tail(self.log_path)))
            try:
                r = requests.get(self.http + "/healthz", timeout=1)
                if r.status_code == 200:
                    return self
                last = "HTTP %d" % r.status_code
            except requests.RequestException as e:
                last = repr(e)
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError("llmgw did not answer GET /healthz with 200 within %.0fs (last: %s)\nlog:\n%s"
                             % (STARTUP_TIMEOUT, last, tail(self.log_path)))

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, timeout=20):
        """SIGTERM and wait; returns the exit code (kills and returns None on timeout)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                self._log.close()
                return None
        self._log.close()
        if self in _running_gateways:
            _running_gateways.remove(self)
        return self.proc.returncode

    def log_tail(self, n=80):
        return tail(self.log_path, n)

    # clients
    def client(self, api_key="sk-test-a", **kw):
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 30)
        return openai.OpenAI(base_url=self.http + "/v1", api_key=api_key, **kw)

    def async_client(self, api_key="sk-test-a", **kw):
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 60)
        return openai.AsyncOpenAI(base_url=self.http + "/v1", api_key=api_key, **kw)


def make_cert(directory, cn="127.0.0.1"):
    """Self-signed cert for 127.0.0.1 via the openssl CLI; returns (cert, key)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "cert.pem", directory / "key.pem"
    openssl = shutil.which("openssl")
    assert openssl, "the openssl CLI is required for the integration tests"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "2",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=%s" % cn,
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return cert, key


def base_config(http_port, https_port=None, tiers=(), keys=None, limits=None, log=None):
    listen = [{"address": "127.0.0.1:%d" % http_port}]
    if https_port:
        listen.append({"address": "127.0.0.1:%d" % https_port, "tls": True})
    lim = {"max_body_bytes": MAX_BODY_BYTES, "max_header_bytes": MAX_HEADER_BYTES, "read_timeout_ms": 10000,
           "request_timeout_ms": REQUEST_TIMEOUT_MS, "max_connections": 1024, "shutdown_grace_ms": 10000}
    lim.update(limits or {})
    cfg = {"listen": listen, "limits": lim}
    if keys:
        cfg["auth"] = {"keys": keys}
    cfg["tiers"] = list(tiers)
    cfg["log"] = log or {"level": "info", "access_log": "-"}
    return cfg


# ------------------------------------------------------------------ helpers used by tests

def chat_text(completion):
    return completion.choices[0].message.content


def expected(stub_name, user_text):
    return stub_upstream.reply_text(stub_name, user_text)


def metric_sum(text, name):
    """Sum of all samples of a Prometheus metric family member `name` (None if absent)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m and m.group(1) == name:
            total += float(m.group(3))
            seen = True
    return total if seen else None


def metric_value(text, name, **labels):
    """Sum of the samples of `name` whose labels include `labels` (None if there is none)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(have.get(k) == str(v) for k, v in labels.items()):
            total += float(m.group(3))
            seen = True
    return total if seen else None


# ------------------------------------------------------------------ engine tiers

def engine_tier(name="small", model_path=None, threads=2, aliases=("gpt-4o-mini",), **extra):
    """An `engine` tier serving ENGINE_MODEL (or model_path) in-process."""
    t = {"name": name, "kind": "engine", "model_path": str(model_path or ENGINE_MODEL), "threads": threads}
    if aliases:
        t["aliases"] = list(aliases)
    t.update(extra)
    return t


def engine_config(http_port, tiers, kv_pool_mb=256, kv_page_kb=256, **kw):
    """base_config plus the engine section; the test keys of the main gateway (sk-test-a...)."""
    kw.setdefault("keys", [{"key": "sk-test-a", "group": "team-a"}])
    # engine answers take a while: keep-alive connections must survive between requests
    kw.setdefault("limits", {"request_timeout_ms": 30000, "read_timeout_ms": 30000})
    cfg = base_config(http_port, tiers=tiers, **kw)
    cfg["engine"] = {"kv_pool_mb": kv_pool_mb, "kv_page_kb": kv_page_kb}
    return cfg


def require_engine_model():
    if not ENGINE_MODEL.is_file():
        pytest.fail("engine model not found at %s -- run scripts/fetch-models (or set LLMGW_ENGINE_MODEL)"
                    % ENGINE_MODEL, pytrace=False)
    return ENGINE_MODEL
