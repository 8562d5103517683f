"""TLS on the client side (gateway listener) and on the upstream side."""

import socket
import ssl
import warnings

import openai
import pytest

from llmgw_it import chat_text, expected, httpx, uniq

MSG = [{"role": "user", "content": "hi"}]


def test_dev_tls_writes_cert_and_key(gateway):
    cert = gateway.tls_dir / "cert.pem"
    key = gateway.tls_dir / "key.pem"
    assert cert.is_file() and b"BEGIN CERTIFICATE" in cert.read_bytes()
    assert key.is_file() and b"PRIVATE KEY" in key.read_bytes()


def test_sdk_over_https_with_verified_cert(gateway):
    http_client = httpx.Client(verify=ssl.create_default_context(cafile=str(gateway.cert)))
    c = openai.OpenAI(base_url=gateway.https + "/v1", api_key="sk-test-a", http_client=http_client, max_retries=0)
    try:
        marker = uniq()
        raw = c.chat.completions.with_raw_response.create(model="small", messages=[{"role": "user", "content": marker}])
        assert chat_text(raw.parse()) == expected("alpha", marker)
        assert raw.headers.get("x-llmgw-tier") == "small"
        # streaming over TLS too
        user = "stub:words=10 " + marker
        chunks = list(c.chat.completions.create(model="small", messages=[{"role": "user", "content": user}],
                                                stream=True))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == expected("alpha", user)
    finally:
        c.close()


def test_https_rejects_unverified_client_by_default(gateway):
    # sanity: the dev cert is self-signed, so a default-verifying client must refuse it;
    # this proves the previous test really verified against cert.pem
    c = openai.OpenAI(base_url=gateway.https + "/v1", api_key="sk-test-a", max_retries=0,
                      http_client=httpx.Client())
    with pytest.raises(openai.APIConnectionError):
        c.models.list()
    c.close()


def _handshake(port, max_version):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    # let *this client* speak old protocols, so any refusal comes from the server
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.maximum_version = max_version
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw) as s:
            return s.version()


def test_tls12_handshake_works(gateway):
    assert _handshake(gateway.https_port, ssl.TLSVersion.TLSv1_2) in ("TLSv1.2",)


def test_tls11_is_refused(gateway):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        v11 = ssl.TLSVersion.TLSv1_1
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)) as ei:
        version = _handshake(gateway.https_port, v11)
        pytest.fail("TLS handshake with max version TLS 1.1 succeeded (%s)" % version)
    msg = str(ei.value).upper()
    # a local refusal would mean the test never asked the server
    assert "NO_PROTOCOLS_AVAILABLE" not in msg and "NO_CIPHERS_AVAILABLE" not in msg, msg
    # and the gateway keeps serving
    assert _handshake(gateway.https_port, ssl.TLSVersion.TLSv1_2)


def test_plain_http_to_tls_port_does_not_hang(gateway):
    with socket.create_connection(("127.0.0.1", gateway.https_port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            data = s.recv(4096)
        except ConnectionResetError:
            data = b""
    assert not data.startswith(b"HTTP/1.1 200"), "TLS port answered plaintext HTTP"


# ------------------------------------------------------------------ HTTPS upstream

def test_https_upstream_with_ca_file(client, stub_tls):
    marker = uniq()
    raw = client.chat.completions.with_raw_response.create(model="secure", messages=[{"role": "user", "content": marker}])
    assert chat_text(raw.parse()) == expected("secure", marker)
    assert raw.headers.get("x-llmgw-tier") == "secure"
    up = stub_tls.requests_with(marker)
    assert len(up) == 1 and up[0]["model"] == "stub-secure"


def test_https_upstream_stream(client):
    user = "stub:words=12 " + uniq()
    chunks = list(client.chat.completions.create(model="secure", messages=[{"role": "user", "content": user}],
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected("secure", user)
    assert chunks[-1].usage is not None


def test_https_upstream_without_verification(client):
    marker = uniq()
    c = client.chat.completions.create(model="secure-noverify", messages=[{"role": "user", "content": marker}])
    assert chat_text(c) == expected("secure", marker)


def test_https_upstream_untrusted_cert_is_refused(client, stub_tls):
    marker = uniq()
    with pytest.raises(openai.APIStatusError) as ei:
        client.chat.completions.create(model="secure-untrusted", messages=[{"role": "user", "content": marker}])
    assert ei.value.status_code in (502, 503, 504), ei.value.status_code
    assert stub_tls.requests_with(marker) == [], "request was sent over an unverified TLS connection"
