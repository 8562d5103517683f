"""Streaming (SSE) through the gateway."""

import time

from llmgw_it import expected, uniq


def test_stream_is_incremental_and_reassembles(client, stub_a):
    marker = uniq()
    # 20 words, 50 ms apart at the stub: ~1 s between the first and last chunk
    user = "stub:words=20 stub:delay=0.05 " + marker
    raw = client.chat.completions.with_raw_response.create(
        model="small", messages=[{"role": "user", "content": user}], stream=True,
        stream_options={"include_usage": True})
    assert raw.headers.get("x-llmgw-tier") == "small"
    assert raw.headers.get("content-type", "").startswith("text/event-stream")
    stream = raw.parse()
    arrivals, pieces, roles, finish, usage = [], [], [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.role:
            roles.append(delta.role)
        if delta.content:
            arrivals.append(time.monotonic())
            pieces.append(delta.content)
        if chunk.choices[0].finish_reason:
            finish.append(chunk.choices[0].finish_reason)

    want = expected("alpha", user)
    assert "".join(pieces) == want
    assert len(pieces) == len(want.split()), "expected one chunk per word"
    assert roles == ["assistant"]
    assert finish == ["stop"]
    assert usage is not None, "no usage chunk although stream_options.include_usage was set"
    assert usage.completion_tokens == len(want.split())
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    spread = arrivals[-1] - arrivals[0]
    # the stub spaces the chunks ~0.95 s apart in total; a buffering gateway delivers them together
    assert spread > 0.4, "chunks were not delivered incrementally (first-to-last spread %.3fs)" % spread

    up = stub_a.requests_with(marker)
    assert len(up) == 1 and up[0]["stream"] is True and up[0]["model"] == "stub-small"


def test_stream_without_usage_has_no_usage_chunk(client):
    user = "stub:words=5 " + uniq()
    chunks = list(client.chat.completions.create(
        model="large", messages=[{"role": "user", "content": user}], stream=True))
    assert all(c.usage is None for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected("beta", user)


def test_completions_stream(client):
    prompt = "stub:words=7 " + uniq()
    stream = client.completions.create(model="small", prompt=prompt, stream=True,
                                       stream_options={"include_usage": True})
    text, usage = [], None
    for c in stream:
        if c.usage is not None:
            usage = c.usage
        if c.choices:
            text.append(c.choices[0].text)
    assert "".join(text) == expected("alpha", prompt)
    assert usage is not None and usage.completion_tokens == 8


def test_sequential_streams_on_one_client(client):
    # keep-alive reuse after a chunked response must work
    for i in range(5):
        user = "stub:words=3 seq%d %s" % (i, uniq())
        chunks = list(client.chat.completions.create(
            model="small", messages=[{"role": "user", "content": user}], stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected("alpha", user)
