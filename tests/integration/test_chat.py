"""Non-streaming chat completions through the gateway over plain HTTP."""

from llmgw_it import chat_text, expected, uniq


def test_chat_reaches_right_upstream_with_rewritten_model(client, stub_a):
    marker = uniq()
    raw = client.chat.completions.with_raw_response.create(
        model="small", messages=[{"role": "user", "content": "hello " + marker}])
    completion = raw.parse()
    assert chat_text(completion) == expected("alpha", "hello " + marker)
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens > 0
    assert raw.headers.get("x-llmgw-tier") == "small"
    assert raw.headers.get("x-request-id"), "no x-request-id response header"

    seen = stub_a.requests_with(marker)
    assert len(seen) == 1, "upstream alpha should have received exactly one request, got %d" % len(seen)
    up = seen[0]
    assert up["path"] == "/v1/chat/completions"
    assert up["model"] == "stub-small", "tier `model:` rewrite not applied upstream"
    # the tier's api_key is what the upstream sees, never the client's key
    assert up["headers"].get("authorization") == "Bearer sk-up-alpha"


def test_alias_resolves_to_tier(client, stub_a):
    marker = uniq()
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": marker}])
    assert chat_text(raw.parse()) == expected("alpha", marker)
    assert raw.headers.get("x-llmgw-tier") == "small"
    assert [r["model"] for r in stub_a.requests_with(marker)] == ["stub-small"]


def test_tier_without_model_sends_requested_name(client, stub_b):
    marker = uniq()
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": marker}])
    assert chat_text(raw.parse()) == expected("beta", marker)
    assert raw.headers.get("x-llmgw-tier") == "large"
    seen = stub_b.requests_with(marker)
    assert len(seen) == 1
    assert seen[0]["model"] == "gpt-4o"
    # no upstream api_key configured for this tier -> the client's key must not leak upstream
    assert "sk-test-a" not in (seen[0]["headers"].get("authorization") or "")


def test_client_request_id_is_echoed(client):
    rid = "it-" + uniq("rid")
    raw = client.chat.completions.with_raw_response.create(
        model="small", messages=[{"role": "user", "content": "hi"}], extra_headers={"x-request-id": rid})
    assert raw.headers.get("x-request-id") == rid


def test_generated_request_ids_differ(client):
    ids = set()
    for _ in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model="small", messages=[{"role": "user", "content": "hi"}])
        ids.add(raw.headers.get("x-request-id"))
    assert None not in ids and "" not in ids
    assert len(ids) == 3, "x-request-id values repeat: %r" % ids


def test_multi_turn_and_content_parts(client, stub_a):
    marker = uniq()
    completion = client.chat.completions.create(
        model="small",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "part-one"},
                                         {"type": "text", "text": marker}]},
        ])
    assert chat_text(completion) == expected("alpha", "part-one " + marker)
    body = stub_a.requests_with(marker)[0]["body"]
    assert len(body["messages"]) == 4, "messages were not passed through intact"
    assert body["messages"][3]["content"][1] == {"type": "text", "text": marker}


def test_tools_and_params_pass_through(client, stub_a):
    marker = uniq()
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    completion = client.chat.completions.create(
        model="small", messages=[{"role": "user", "content": marker}], tools=tools,
        temperature=0.25, max_tokens=64, top_p=0.9, user="it-user", seed=7)
    msg = completion.choices[0].message
    assert completion.choices[0].finish_reason == "tool_calls"
    assert msg.tool_calls and msg.tool_calls[0].function.name == "get_weather"
    body = stub_a.requests_with(marker)[0]["body"]
    assert body["tools"] == tools
    assert body["temperature"] == 0.25 and body["max_tokens"] == 64 and body["top_p"] == 0.9
    assert body["user"] == "it-user" and body["seed"] == 7


def test_boundary_values_are_accepted(client):
    completion = client.chat.completions.create(
        model="small", messages=[{"role": "user", "content": "edge"}], temperature=2, n=1, max_tokens=1)
    assert chat_text(completion) == expected("alpha", "edge")


def test_unicode_round_trip(client):
    text = "héllo wörld ✓ 日本語 \U0001F600"
    completion = client.chat.completions.create(model="small", messages=[{"role": "user", "content": text}])
    assert chat_text(completion) == expected("alpha", text)
