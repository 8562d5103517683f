"""Operational surface: health, metrics, graceful shutdown, config checking."""

import re
import signal
import socket
import subprocess
import time

import pytest
import requests

from llmgw_it import LLMGW_BIN, base_config, expected, free_port, make_cert, metric_sum, uniq, wait_until

AUTH = {"Authorization": "Bearer sk-test-a"}


def test_healthz_and_readyz(gateway):
    for path in ("/healthz", "/readyz"):
        r = requests.get(gateway.http + path, timeout=5)  # probes carry no API key
        assert r.status_code == 200, "%s -> %d %r" % (path, r.status_code, r.text[:200])


def test_metrics_count_requests(gateway, client):
    r = requests.get(gateway.http + "/metrics", headers=AUTH, timeout=5)
    assert r.status_code == 200
    assert r.headers.get("content-type", "").startswith("text/plain")
    assert re.search(r"^# TYPE llmgw_requests_total counter$", r.text, re.M), "no TYPE line for llmgw_requests_total"
    before = metric_sum(r.text, "llmgw_requests_total")
    assert before is not None, "llmgw_requests_total has no samples:\n" + r.text[:2000]

    for _ in range(3):
        client.chat.completions.create(model="small", messages=[{"role": "user", "content": "count me"}])
    after = metric_sum(requests.get(gateway.http + "/metrics", headers=AUTH, timeout=5).text, "llmgw_requests_total")
    assert after >= before + 3, "llmgw_requests_total went %s -> %s after 3 requests" % (before, after)


def test_metrics_exposition_is_parseable(gateway):
    text = requests.get(gateway.http + "/metrics", headers=AUTH, timeout=5).text
    sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})?'
                        r' [-+]?([0-9.]+([eE][-+]?[0-9]+)?|NaN|[-+]?Inf)( [0-9]+)?$')
    bad = [line for line in text.splitlines()
           if line and not line.startswith("#") and not sample.match(line)]
    assert not bad, "lines that are not valid Prometheus samples: %r" % bad[:5]


def test_access_log_to_stderr_names_the_request(gateway, client):
    rid = "alog-" + uniq()
    client.chat.completions.create(model="small", messages=[{"role": "user", "content": "log me"}],
                                   extra_headers={"x-request-id": rid})
    wait_until(lambda: rid in gateway.log_path.read_text(errors="replace"), timeout=5,
               what="access log line with request id %s on stderr" % rid)


def test_access_log_to_file(gateway_factory, stub_b, tmp_path):
    log_file = tmp_path / "access.log"
    cfg = base_config(free_port(), tiers=[{"name": "m", "kind": "upstream", "base_url": stub_b.base_url}],
                      log={"level": "warn", "access_log": str(log_file)})
    gw = gateway_factory(cfg)
    rid = "flog-" + uniq()
    r = requests.post(gw.http + "/v1/chat/completions", timeout=10, headers={"x-request-id": rid},
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    wait_until(lambda: log_file.exists() and rid in log_file.read_text(errors="replace"), timeout=5,
               what="access log file line with request id")


# ------------------------------------------------------------------ graceful shutdown

def _refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


def test_graceful_shutdown_finishes_streams(gateway_factory, stub_b):
    cfg = base_config(free_port(), tiers=[{"name": "m", "kind": "upstream", "base_url": stub_b.base_url}],
                      limits={"shutdown_grace_ms": 15000})
    gw = gateway_factory(cfg)
    c = gw.client(api_key="unused")  # no keys configured -> auth disabled
    user = "stub:words=40 stub:delay=0.05 " + uniq()  # ~2 s of streaming
    stream = c.chat.completions.create(model="m", messages=[{"role": "user", "content": user}], stream=True)
    it = iter(stream)
    parts = []
    while not parts:
        ch = next(it)
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)

    gw.signal(signal.SIGTERM)
    t_term = time.monotonic()
    wait_until(lambda: _refused(gw.http_port), timeout=3, interval=0.02,
               what="listener to close after SIGTERM")
    assert gw.alive(), "llmgw exited while a stream was still in flight"

    for ch in it:
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)
    assert "".join(parts) == expected("beta", user), "stream cut short by shutdown"
    c.close()

    rc = gw.proc.wait(timeout=15)
    assert rc == 0, "llmgw exit code after graceful shutdown: %r\n%s" % (rc, gw.log_tail())
    assert time.monotonic() - t_term < 15


def test_sigterm_when_idle_exits_promptly(gateway_factory, stub_b):
    gw = gateway_factory(base_config(free_port(), tiers=[{"name": "m", "kind": "upstream",
                                                          "base_url": stub_b.base_url}]))
    assert requests.get(gw.http + "/healthz", timeout=5).status_code == 200
    gw.signal(signal.SIGTERM)
    assert gw.proc.wait(timeout=10) == 0


def test_auth_disabled_without_keys(gateway_factory, stub_b):
    gw = gateway_factory(base_config(free_port(), tiers=[{"name": "m", "kind": "upstream",
                                                          "base_url": stub_b.base_url}]))
    r = requests.post(gw.http + "/v1/chat/completions", json={"model": "m", "messages": [
        {"role": "user", "content": "open"}]}, timeout=10)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["choices"][0]["message"]["content"] == expected("beta", "open")


# ------------------------------------------------------------------ --check-config

GOOD_CONFIG = """\
# a config in the documented format (comments, flow mappings, flow lists)
listen:
  - address: 127.0.0.1:{http}          # plain HTTP
  - address: 127.0.0.1:{https}
    tls: true
    cert: tls/cert.pem
    key: tls/key.pem
limits:
  max_body_bytes: 1048576
  max_header_bytes: 16384
  read_timeout_ms: 15000
  request_timeout_ms: 30000
  max_connections: 1024
  shutdown_grace_ms: 30000
auth:
  keys:
    - key: sk-test-a
      group: team-a
      rate_limit: {{requests_per_second: 50, burst: 100}}
    - key: "sk-test-b"
      group: 'team-b'
tiers:
  - name: small
    kind: upstream
    base_url: http://127.0.0.1:9001/v1
    api_key: sk-upstream
    model: stub-small
    aliases: [gpt-4o-mini, "gpt-4o-mini-2024"]
    connect_timeout_ms: 2000
    timeout_ms: 60000
    max_connections: 256
    retries: 1
    fallback: large
    tls_verify: true
  - name: large
    kind: upstream
    base_url: https://127.0.0.1:9002/v1
    tls_verify: true
    ca_file: tls/cert.pem
log:
  level: info
  access_log: "-"
"""


def check_config(path):
    if not LLMGW_BIN.exists():
        pytest.fail("llmgw binary not found at %s" % LLMGW_BIN, pytrace=False)
    return subprocess.run([str(LLMGW_BIN), "--check-config", str(path)], capture_output=True, text=True, timeout=20)


def test_check_config_good(tmp_path):
    make_cert(tmp_path / "tls")
    cfg = tmp_path / "good.yaml"
    cfg.write_text(GOOD_CONFIG.format(http=free_port(), https=free_port()))
    p = check_config(cfg)
    assert p.returncode == 0, "rc=%d\nstdout:%s\nstderr:%s" % (p.returncode, p.stdout, p.stderr)


def test_check_config_does_not_start_serving(tmp_path):
    make_cert(tmp_path / "tls")
    http = free_port()
    cfg = tmp_path / "good.yaml"
    cfg.write_text(GOOD_CONFIG.format(http=http, https=free_port()))
    p = check_config(cfg)  # returns (does not serve forever)
    assert p.returncode == 0
    assert _refused(http)


_BAD = {
    # name: (text, line of the error (1-based), acceptable slack in lines)
    "bad-indentation": ("listen:\n  - address: 127.0.0.1:8080\n limits:\n    max_body_bytes: 100000\n", 3, 1),
    "unknown-key": ("listen:\n  - address: 127.0.0.1:8080\nlimits:\n  max_body_bytes: 100000\n"
                    "  max_bodyy_bytes: 200\ntiers:\n  - name: a\n    kind: upstream\n"
                    "    base_url: http://127.0.0.1:9/v1\n", 5, 0),
    "wrong-type": ("listen:\n  - address: 127.0.0.1:8080\nlimits:\n  max_body_bytes: lots\ntiers:\n"
                   "  - name: a\n    kind: upstream\n    base_url: http://127.0.0.1:9/v1\n", 4, 0),
    "unknown-tier-key": ("listen:\n  - address: 127.0.0.1:8080\ntiers:\n  - name: a\n    kind: upstream\n"
                         "    base_url: http://127.0.0.1:9/v1\n    colour: blue\n", 7, 0),
    "list-where-map": ("listen:\n  - address: 127.0.0.1:8080\nlimits:\n  - 1\n  - 2\ntiers:\n  - name: a\n"
                       "    kind: upstream\n    base_url: http://127.0.0.1:9/v1\n", 4, 1),
}


@pytest.mark.parametrize("case", sorted(_BAD))
def test_check_config_bad(tmp_path, case):
    text, line, slack = _BAD[case]
    cfg = tmp_path / ("broken-%s.yaml" % case)
    cfg.write_text(text)
    p = check_config(cfg)
    assert p.returncode != 0, "broken config (%s) accepted" % case
    locs = [(int(a), int(b)) for a, b in re.findall(re.escape(cfg.name) + r":(\d+):(\d+)", p.stderr)]
    assert locs, "no %s:LINE:COLUMN in stderr: %r" % (cfg.name, p.stderr)
    assert any(abs(ln - line) <= slack for ln, _ in locs), \
        "error reported at %r, expected line %d (+-%d); stderr: %r" % (locs, line, slack, p.stderr)
    assert all(col >= 1 for _, col in locs), "columns are 1-based: %r" % locs


def test_start_with_broken_config_fails(tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text(_BAD["unknown-key"][0])
    if not LLMGW_BIN.exists():
        pytest.fail("llmgw binary not found at %s" % LLMGW_BIN, pytrace=False)
    p = subprocess.run([str(LLMGW_BIN), "-c", str(cfg)], capture_output=True, text=True, timeout=20)
    assert p.returncode != 0
    assert re.search(re.escape(cfg.name) + r":5:\d+", p.stderr), p.stderr
