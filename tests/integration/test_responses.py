"""The Responses API (issue 19) through the official openai SDK: POST /v1/responses on an engine
tier and on an upstream tier that speaks only Chat Completions (translated both ways), streamed
with the Responses event sequence, stored responses (GET, DELETE, previous_response_id chaining,
store: false, another tenant sees nothing), text.format json_schema (validated by jsonschema),
function tools and function_call_output round trips, and errors in the OpenAI shape."""
import json

import jsonschema
import openai
import pytest
import requests

from llmgw_it import expected, uniq

TIER = "gpt-4o-mini"   # the engine tier `small`


def test_a_string_input_is_answered(engine_client):
    r = engine_client.responses.create(model=TIER, input="Say hello.", max_output_tokens=24,
                                       temperature=0)
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status in ("completed", "incomplete")
    assert r.output_text
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    # max_output_tokens reached: incomplete, and why
    cut = engine_client.responses.create(model=TIER, input="Tell me a long story.",
                                         instructions="Be verbose.", max_output_tokens=4,
                                         temperature=0)
    assert cut.status == "incomplete"
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 4
    assert cut.instructions == "Be verbose."


def test_stream_has_the_responses_event_sequence(engine_client):
    whole = engine_client.responses.create(model=TIER, input="Count to five.",
                                           max_output_tokens=20, temperature=0)
    events = list(engine_client.responses.create(model=TIER, input="Count to five.",
                                                 max_output_tokens=20, temperature=0,
                                                 stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"
                          if whole.status == "incomplete" else "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    final = events[-1].response
    assert final.output_text == text and final.usage.output_tokens == whole.usage.output_tokens


def test_stored_responses_chain_and_delete(engine_client):
    first = engine_client.responses.create(model=TIER, input="My name is Ada. Reply OK.",
                                           max_output_tokens=8, temperature=0)
    got = engine_client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text
    second = engine_client.responses.create(model=TIER, input="What is my name?",
                                            previous_response_id=first.id,
                                            max_output_tokens=8, temperature=0)
    alone = engine_client.responses.create(model=TIER, input="What is my name?",
                                           max_output_tokens=8, temperature=0)
    # the stored conversation (question and answer) came before the new input
    assert second.usage.input_tokens > alone.usage.input_tokens + 5
    assert second.previous_response_id == first.id
    engine_client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        engine_client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as ei:
        engine_client.responses.create(model=TIER, input="again", previous_response_id=first.id)
    assert ei.value.body["param"] == "previous_response_id"
    unstored = engine_client.responses.create(model=TIER, input="Hi", max_output_tokens=2,
                                              store=False)
    with pytest.raises(openai.NotFoundError):
        engine_client.responses.retrieve(unstored.id)


def test_json_schema_text_format(engine_client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    r = engine_client.responses.create(
        model=TIER, input="Name a big city and its population.", max_output_tokens=60,
        temperature=0, text={"format": {"type": "json_schema", "name": "city", "schema": schema,
                                        "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)


def test_function_tools_round_trip(engine_client):
    tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city.",
              "parameters": {"type": "object", "properties": {"city": {"type": "string",
                                                                       "maxLength": 30}},
                             "required": ["city"], "additionalProperties": False}}]
    r = engine_client.responses.create(model=TIER, input="What's the weather in Rome?",
                                       tools=tools, tool_choice="required",
                                       max_output_tokens=60, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert "city" in json.loads(calls[0].arguments)
    assert calls[0].call_id.startswith("call_")
    follow = engine_client.responses.create(
        model=TIER, previous_response_id=r.id, tools=tools, tool_choice="none",
        max_output_tokens=20, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": json.dumps({"celsius": 21})}])
    assert follow.output_text
    # streamed, the call is a function_call item with its argument events
    events = list(engine_client.responses.create(model=TIER, input="Weather in Oslo?",
                                                 tools=tools, tool_choice="required",
                                                 max_output_tokens=60, temperature=0,
                                                 stream=True))
    types = [e.type for e in events]
    assert "response.function_call_arguments.done" in types
    done = [e for e in events if e.type == "response.output_item.done"][0]
    assert done.item.type == "function_call" and done.item.name == "get_weather"


def test_upstream_tier_is_translated_both_ways(client, stub_a):
    marker = uniq()
    r = client.responses.create(model="small", input=marker, instructions="be brief")
    assert r.output_text == expected("alpha", marker)
    body = stub_a.requests_with(marker)[0]["body"]
    assert body["messages"][0] == {"role": "system", "content": "be brief"}
    assert body["messages"][1]["content"] == marker
    text = "".join(e.delta for e in client.responses.create(model="small", input=marker + "s",
                                                            stream=True)
                   if e.type == "response.output_text.delta")
    assert text == expected("alpha", marker + "s")


def test_another_tenant_sees_no_stored_response(gateway, client):
    r = client.responses.create(model="small", input=uniq())
    other = gateway.client(api_key="sk-test-b")
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(r.id)
    assert client.responses.retrieve(r.id).id == r.id
    other.close()


@pytest.mark.parametrize("body,param", [
    ({"model": "small"}, "input"),
    ({"input": "hi"}, "model"),
    ({"model": "small", "input": [{"type": "reasoning"}]}, "input[0]"),
    ({"model": "small", "input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"model": "small", "input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
])
def test_bad_requests_are_400_naming_the_field(gateway, body, param):
    r = requests.post(gateway.http + "/v1/responses", json=body, timeout=30,
                      headers={"Authorization": "Bearer sk-test-a"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
