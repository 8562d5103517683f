"""Fallback to another tier when the first one fails before the first byte."""

import openai
import pytest

from llmgw_it import chat_text, expected, uniq


def test_dead_upstream_falls_back(client, stub_b):
    marker = uniq()
    raw = client.chat.completions.with_raw_response.create(
        model="primary", messages=[{"role": "user", "content": marker}])
    assert chat_text(raw.parse()) == expected("beta", marker)
    assert raw.headers.get("x-llmgw-tier") == "backup"
    up = stub_b.requests_with(marker)
    assert len(up) == 1 and up[0]["model"] == "stub-backup", "fallback tier's model rewrite not applied"


def test_dead_upstream_falls_back_for_streams(client):
    user = "stub:words=6 " + uniq()
    raw = client.chat.completions.with_raw_response.create(
        model="primary", messages=[{"role": "user", "content": user}], stream=True)
    assert raw.headers.get("x-llmgw-tier") == "backup"
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert text == expected("beta", user)


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
def test_upstream_503_falls_back(client, stub_a, stub_b, stream):
    marker = uniq()
    # only the stub named alpha obeys the magic; the backup (beta) answers normally
    user = "stub:status=503@alpha " + marker
    raw = client.chat.completions.with_raw_response.create(
        model="flaky", messages=[{"role": "user", "content": user}], stream=stream)
    assert raw.headers.get("x-llmgw-tier") == "backup"
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    else:
        text = chat_text(raw.parse())
    assert text == expected("beta", user)
    assert len(stub_a.requests_with(marker)) >= 1, "the flaky tier was never tried"
    assert [r["model"] for r in stub_b.requests_with(marker)] == ["stub-backup"]


def test_upstream_connection_drop_falls_back(client, stub_b):
    marker = uniq()
    user = "stub:close@alpha " + marker
    raw = client.chat.completions.with_raw_response.create(
        model="flaky", messages=[{"role": "user", "content": user}])
    assert raw.headers.get("x-llmgw-tier") == "backup"
    assert chat_text(raw.parse()) == expected("beta", user)


def test_upstream_4xx_is_passed_through_not_fallen_back(client, stub_b):
    # a client error from the upstream is the client's problem, not a tier failure
    marker = uniq()
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="flaky",
                                       messages=[{"role": "user", "content": "stub:status=400@alpha " + marker}])
    assert ei.value.status_code == 400
    assert stub_b.requests_with(marker) == []


def test_upstream_error_without_fallback_is_5xx(client):
    with pytest.raises(openai.InternalServerError) as ei:
        client.chat.completions.create(model="small", messages=[{"role": "user", "content": "stub:status=503 " + uniq()}])
    assert ei.value.status_code in (502, 503)
