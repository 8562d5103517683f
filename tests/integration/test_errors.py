"""Errors surface as the right OpenAI SDK exception types with OpenAI-shaped bodies."""

import json
import socket

import openai
import pytest
import requests
from openai.types.chat import ChatCompletion

from llmgw_it import MAX_BODY_BYTES, MAX_HEADER_BYTES, expected, uniq

MSG = [{"role": "user", "content": "hi"}]


def error_obj(resp):
    """The `error` object of an OpenAI-shaped error response (asserts the shape)."""
    try:
        body = resp.json()
    except ValueError:
        raise AssertionError("error response is not JSON: %r" % resp.text[:300])
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), "not OpenAI error shape: %r" % body
    err = body["error"]
    for k in ("message", "type", "param", "code"):
        assert k in err, "error.%s missing in %r" % (k, err)
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    return err


# ------------------------------------------------------------------ auth

def test_bad_api_key_is_authentication_error(gateway):
    c = gateway.client(api_key="sk-wrong")
    with pytest.raises(openai.AuthenticationError) as ei:
        c.chat.completions.create(model="small", messages=MSG)
    assert ei.value.status_code == 401
    error_obj(ei.value.response)


def test_missing_api_key_is_401(gateway):
    r = requests.post(gateway.http + "/v1/chat/completions", json={"model": "small", "messages": MSG}, timeout=10)
    assert r.status_code == 401
    error_obj(r)


def test_bad_key_does_not_reach_upstream(gateway, stub_a):
    marker = uniq()
    with pytest.raises(openai.AuthenticationError):
        gateway.client(api_key="sk-wrong").chat.completions.create(
            model="small", messages=[{"role": "user", "content": marker}])
    assert stub_a.requests_with(marker) == []


def test_models_endpoint_requires_auth(gateway):
    with pytest.raises(openai.AuthenticationError):
        gateway.client(api_key="sk-wrong").models.list()


# ------------------------------------------------------------------ routing

def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as ei:
        client.chat.completions.create(model="no-such-model", messages=MSG)
    err = error_obj(ei.value.response)
    assert err["code"] == "model_not_found"
    assert "no-such-model" in err["message"]


def test_unknown_route_is_404_json(gateway):
    r = requests.get(gateway.http + "/v1/nope", headers={"Authorization": "Bearer sk-test-a"}, timeout=10)
    assert r.status_code == 404
    error_obj(r)


# ------------------------------------------------------------------ validation

def _create_raw(client, **body):
    return client.post("/chat/completions", body=body, cast_to=ChatCompletion)


@pytest.mark.parametrize("body,param", [
    ({"model": "small"}, "messages"),
    ({"model": "small", "messages": "hi"}, "messages"),
    ({"model": "small", "messages": MSG, "temperature": "hot"}, "temperature"),
    ({"model": "small", "messages": MSG, "temperature": 5}, "temperature"),
    ({"model": "small", "messages": MSG, "max_tokens": -1}, "max_tokens"),
    ({"model": "small", "messages": MSG, "n": 0}, "n"),
    ({"messages": MSG}, "model"),
], ids=["messages-missing", "messages-not-array", "temperature-string", "temperature-5",
        "max_tokens-negative", "n-zero", "model-missing"])
def test_invalid_request_is_bad_request(client, stub_a, body, param):
    marker = uniq()
    body = json.loads(json.dumps(body).replace('"hi"', json.dumps(marker)))
    with pytest.raises(openai.BadRequestError) as ei:
        _create_raw(client, **body)
    err = error_obj(ei.value.response)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param, "error.param: want %r, got %r (%s)" % (param, err["param"], err["message"])
    # the SDK exposes the parsed error object too
    assert ei.value.body.get("param") == param
    assert stub_a.requests_with(marker) == [], "invalid request was forwarded upstream"


def test_invalid_via_typed_sdk_call(client):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="small", messages=MSG, temperature="hot")
    assert error_obj(ei.value.response)["param"] == "temperature"


@pytest.mark.parametrize("payload", [
    b'{"model": "small", "messages": [',
    b'not json at all',
    b'',
    b'["an", "array"]',
    b'{"model": "small", "messages": [{"role": "user", "content": "hi"}]} trailing',
], ids=["truncated", "garbage", "empty", "array", "trailing-garbage"])
def test_malformed_json_is_400(gateway, payload):
    r = requests.post(gateway.http + "/v1/chat/completions", data=payload, timeout=10,
                      headers={"Authorization": "Bearer sk-test-a", "Content-Type": "application/json"})
    assert r.status_code == 400, "got %d %r" % (r.status_code, r.text[:200])
    assert r.headers.get("content-type", "").startswith("application/json")
    err = error_obj(r)
    assert err["type"] == "invalid_request_error"


def test_other_content_type_is_handled(gateway):
    body = json.dumps({"model": "small", "messages": MSG})
    r = requests.post(gateway.http + "/v1/chat/completions", data=body, timeout=10,
                      headers={"Authorization": "Bearer sk-test-a", "Content-Type": "text/plain"})
    # accepting it is fine; rejecting it must be a clean OpenAI-shaped 4xx
    if r.status_code == 200:
        assert r.json()["choices"][0]["message"]["content"] == expected("alpha", "hi")
    else:
        assert r.status_code in (400, 415)
        error_obj(r)


def test_wrong_method_is_rejected(gateway):
    r = requests.get(gateway.http + "/v1/chat/completions", headers={"Authorization": "Bearer sk-test-a"},
                     timeout=10)
    assert r.status_code in (404, 405)
    error_obj(r)


# ------------------------------------------------------------------ rate limit

def test_rate_limit_third_rapid_request(gateway):
    c = gateway.client(api_key="sk-test-rl")  # 1 request/s, burst 2
    c.chat.completions.create(model="small", messages=MSG)
    c.chat.completions.create(model="small", messages=MSG)
    with pytest.raises(openai.RateLimitError) as ei:
        c.chat.completions.create(model="small", messages=MSG)
    resp = ei.value.response
    assert resp.status_code == 429
    ra = resp.headers.get("retry-after")
    assert ra is not None, "429 without Retry-After"
    assert ra.strip().isdigit() and int(ra) >= 1, "Retry-After must be integer seconds >= 1, got %r" % ra
    error_obj(resp)
    # other keys are not affected
    ok = gateway.client(api_key="sk-test-a").chat.completions.create(model="small", messages=MSG)
    assert ok.choices[0].message.content == expected("alpha", "hi")


# ------------------------------------------------------------------ size limits

def _big_body(total):
    filler = "x" * total
    return json.dumps({"model": "small", "messages": [{"role": "user", "content": filler}]}).encode()


def test_body_just_under_limit_is_accepted(gateway):
    body = _big_body(MAX_BODY_BYTES - 200)
    assert len(body) < MAX_BODY_BYTES
    r = requests.post(gateway.http + "/v1/chat/completions", data=body, timeout=20,
                      headers={"Authorization": "Bearer sk-test-a", "Content-Type": "application/json"})
    assert r.status_code == 200, r.text[:300]


def test_body_over_limit_is_413(gateway):
    body = _big_body(MAX_BODY_BYTES * 2)
    r = requests.post(gateway.http + "/v1/chat/completions", data=body, timeout=20,
                      headers={"Authorization": "Bearer sk-test-a", "Content-Type": "application/json"})
    assert r.status_code == 413
    error_obj(r)


def test_chunked_body_over_limit_is_413(gateway):
    body = _big_body(MAX_BODY_BYTES * 2)
    pieces = (body[i:i + 8192] for i in range(0, len(body), 8192))  # generator -> chunked upload
    r = requests.post(gateway.http + "/v1/chat/completions", data=pieces, timeout=20,
                      headers={"Authorization": "Bearer sk-test-a", "Content-Type": "application/json"})
    assert r.status_code == 413


def test_body_over_limit_via_sdk(client):
    with pytest.raises(openai.APIStatusError) as ei:
        client.chat.completions.create(model="small", messages=[{"role": "user", "content": "y" * (MAX_BODY_BYTES * 2)}])
    assert ei.value.status_code == 413


def test_header_over_limit_is_431(gateway):
    r = requests.post(gateway.http + "/v1/chat/completions", json={"model": "small", "messages": MSG}, timeout=10,
                      headers={"Authorization": "Bearer sk-test-a", "X-Big": "a" * (MAX_HEADER_BYTES * 2)})
    assert r.status_code == 431


def test_moderate_header_is_fine(gateway):
    r = requests.post(gateway.http + "/v1/chat/completions", json={"model": "small", "messages": MSG}, timeout=10,
                      headers={"Authorization": "Bearer sk-test-a", "X-Medium": "a" * (MAX_HEADER_BYTES // 4)})
    assert r.status_code == 200


def test_garbage_request_line_gets_400_and_gateway_survives(gateway):
    with socket.create_connection(("127.0.0.1", gateway.http_port), timeout=5) as s:
        s.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        data = b""
        try:
            while True:
                b = s.recv(4096)
                if not b:
                    break
                data += b
        except (ConnectionResetError, socket.timeout):
            pass
    assert data == b"" or data.startswith(b"HTTP/1.") and b" 400 " in data.split(b"\r\n", 1)[0]
    assert requests.get(gateway.http + "/healthz", timeout=5).status_code == 200
