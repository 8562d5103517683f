"""Client disconnects, slow clients, and many concurrent streams."""

import asyncio
import json
import socket
import threading
import time

import pytest
import requests

from llmgw_it import REQUEST_TIMEOUT_MS, expected, httpx, uniq, wait_until


def test_client_disconnect_cancels_upstream_stream(gateway, client, stub_a):
    before = stub_a.stats()
    user = "stub:words=500 stub:delay=0.02 " + uniq()  # ~10 s if nobody cancels it
    stream = client.chat.completions.create(model="small", messages=[{"role": "user", "content": user}], stream=True)
    got = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            got.append(chunk.choices[0].delta.content)
        if len(got) >= 3:
            break
    assert "".join(got) == "[alpha] w1 w2 "
    assert stub_a.stats()["active_streams"] >= before["active_streams"] + 1
    stream.close()  # drops the connection mid-stream

    after = wait_until(lambda: (lambda s: s if s["cancelled_streams"] > before["cancelled_streams"] else None)(
        stub_a.stats()), timeout=5, what="stub to see the upstream stream cancelled")
    assert after["completed_streams"] == before["completed_streams"], "upstream stream ran to completion"
    wait_until(lambda: stub_a.stats()["active_streams"] == before["active_streams"], timeout=5,
               what="no active upstream streams left")
    assert requests.get(gateway.http + "/healthz", timeout=5).status_code == 200
    c = client.chat.completions.create(model="small", messages=[{"role": "user", "content": "still there"}])
    assert c.choices[0].message.content == expected("alpha", "still there")


def _read_until_closed(sock, timeout):
    """Read until EOF/reset; returns (bytes, seconds waited)."""
    sock.settimeout(timeout)
    t0 = time.monotonic()
    data = b""
    try:
        while True:
            b = sock.recv(4096)
            if not b:
                break
            data += b
    except ConnectionResetError:
        pass
    except socket.timeout:
        raise AssertionError("gateway kept a stalled connection open for %.1fs (request_timeout_ms=%d); got %r"
                             % (time.monotonic() - t0, REQUEST_TIMEOUT_MS, data[:200]))
    return data, time.monotonic() - t0


@pytest.mark.parametrize("partial", [
    b"POST /v1/chat/compl",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test-a\r\n"
    b"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"model\": \"small\",",
], ids=["half-request-line", "half-body"])
def test_slow_client_is_cut_off_while_others_are_served(gateway, client, partial):
    with socket.create_connection(("127.0.0.1", gateway.http_port), timeout=5) as s:
        s.sendall(partial)
        t0 = time.monotonic()
        # meanwhile, other clients are served normally
        marker = uniq()
        c = client.chat.completions.create(model="small", messages=[{"role": "user", "content": marker}])
        assert c.choices[0].message.content == expected("alpha", marker)
        data, _ = _read_until_closed(s, REQUEST_TIMEOUT_MS / 1000.0 + 5)
        waited = time.monotonic() - t0
    # it must be the timeout that closed it, not an immediate reject of a partial request
    assert waited >= REQUEST_TIMEOUT_MS / 1000.0 * 0.5, "closed after only %.2fs" % waited
    if data:
        status_line = data.split(b"\r\n", 1)[0]
        assert status_line.startswith(b"HTTP/1.1 408") or status_line.startswith(b"HTTP/1.0 408"), status_line
    assert requests.get(gateway.http + "/healthz", timeout=5).status_code == 200


def test_idle_keepalive_connections_do_not_block_others(gateway):
    # a pile of idle connections must not starve new requests
    socks = [socket.create_connection(("127.0.0.1", gateway.http_port), timeout=5) for _ in range(50)]
    try:
        r = requests.get(gateway.http + "/healthz", timeout=5)
        assert r.status_code == 200
    finally:
        for s in socks:
            s.close()


N_STREAMS = 200


def test_200_concurrent_streams(gateway, stub_b):
    before = stub_b.stats()
    tag = uniq()

    async def one(client, i):
        user = "stub:words=15 stub:delay=0.02 c%d %s" % (i, tag)
        stream = await client.chat.completions.create(
            model="large", messages=[{"role": "user", "content": user}], stream=True,
            stream_options={"include_usage": True})
        parts, usage = [], None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        return user, "".join(parts), usage

    async def run_all():
        http_client = httpx.AsyncClient(limits=httpx.Limits(max_connections=N_STREAMS + 50,
                                                            max_keepalive_connections=N_STREAMS + 50),
                                        timeout=httpx.Timeout(120, connect=30))
        client = gateway.async_client(http_client=http_client)
        try:
            return await asyncio.gather(*(one(client, i) for i in range(N_STREAMS)), return_exceptions=True)
        finally:
            await client.close()

    results = asyncio.run(asyncio.wait_for(run_all(), timeout=90))
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, "%d/%d streams failed; first: %r" % (len(errors), N_STREAMS, errors[0])
    bad = [(u, t) for u, t, _ in results if t != expected("beta", u)]
    assert not bad, "%d streams with wrong content; first: %r" % (len(bad), bad[0])
    assert all(usage is not None and usage.completion_tokens == 16 for _, _, usage in results)
    after = stub_b.stats()
    assert after["completed_streams"] - before["completed_streams"] >= N_STREAMS
    # not a timing threshold: a gateway that serialises streams would show a peak of 1
    assert after["peak_active_streams"] > 1
    assert requests.get(gateway.http + "/healthz", timeout=5).status_code == 200


def test_many_concurrent_non_stream_requests(gateway):
    errors, results = [], []

    def worker(i):
        try:
            # Correctness under concurrency, not speed: a loaded machine running the sanitized
            # daemon may take long over 50 answers at once.
            c = gateway.client(timeout=180)
            marker = "nc%d-%s" % (i, uniq())
            r = c.chat.completions.create(model="small", messages=[{"role": "user", "content": marker}])
            results.append(r.choices[0].message.content == expected("alpha", marker))
            c.close()
        except Exception as e:  # noqa: BLE001 - collected and reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not errors, errors[:3]
    assert results.count(True) == 50


def _get_on(sock, path):
    """GET path over an open keep-alive socket; the body of the Content-Length answer."""
    sock.settimeout(5)
    sock.sendall(("GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int([l.split(b":", 1)[1] for l in head.split(b"\r\n")
                  if l.lower().startswith(b"content-length:")][0])
    while len(body) < length:
        body += sock.recv(65536)
    return body.decode(errors="replace")


def test_max_connections_holds_new_ones_back(gateway_factory, stub_b):
    """At limits.max_connections, with every slot answering a request (idle ones would be closed
    to make room: test_hardening), llmgw stops accepting; a waiting connection is served as soon
    as one of the busy ones closes."""
    from llmgw_it import base_config, free_port
    cfg = base_config(free_port(), tiers=[{"name": "m", "kind": "upstream", "base_url": stub_b.base_url}],
                      limits={"max_connections": 3})
    gw = gateway_factory(cfg)
    port = int(gw.http.rsplit(":", 1)[1])
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hold stub:sleep=4"}]})
    slow = ("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test-a\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)).encode()
    busy = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
    for b in busy:
        b.sendall(slow)      # the upstream holds each answer for 4 s
    time.sleep(1.0)          # the gateway has read all three: every slot is answering
    waiting = socket.create_connection(("127.0.0.1", port), timeout=5)  # the kernel backlog takes it
    waiting.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    waiting.settimeout(1.0)
    with pytest.raises(socket.timeout):
        waiting.recv(100)  # not accepted: no answer
    busy[1].close()        # the gateway notices and frees the slot
    waiting.settimeout(5)
    assert waiting.recv(100).startswith(b"HTTP/1.1 200")
    for s in busy + [waiting]:
        s.close()


def test_connect_failures_are_retried(gateway_factory):
    """retries: N makes N more attempts on a connect failure before the request fails."""
    from llmgw_it import base_config, free_port, metric_value
    dead = "http://127.0.0.1:%d/v1" % free_port()
    cfg = base_config(free_port(), tiers=[{"name": "d", "kind": "upstream", "base_url": dead,
                                           "retries": 2, "connect_timeout_ms": 500}])
    gw = gateway_factory(cfg)
    r = requests.post(gw.http + "/v1/chat/completions", timeout=10,
                      json={"model": "d", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_unavailable"
    m = requests.get(gw.http + "/metrics", timeout=5).text
    assert metric_value(m, "llmgw_upstream_errors_total", tier="d", kind="connect") == 3
