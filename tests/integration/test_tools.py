"""Tool calls on an engine tier (issue 19): the tools go into the prompt in the model family's
format (SmolLM2 is ChatML: the Hermes/Qwen2.5 <tool_call> format), generation is constrained to
text or a valid call of one of the tools (tool_choice auto / required / a named function), the
answer comes back as OpenAI tool_calls (streamed as a tool_calls delta), and `tool` results go
back into the conversation. Clients: the official openai SDK and langchain-openai's bind_tools;
arguments are validated against the tool's schema by `jsonschema`."""
import json

import jsonschema
import openai
import pytest

TIER = "gpt-4o-mini"   # the engine tier `small`

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The current time.",
                                      "parameters": {"type": "object", "properties": {},
                                                     "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]


def check_call(call):
    assert call.type == "function"
    assert call.id.startswith("call_") and len(call.id) == 29
    assert call.function.name in SCHEMAS
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


def test_required_tool_choice_gives_a_valid_call(engine_client):
    for seed in range(3):
        r = engine_client.chat.completions.create(model=TIER, messages=ASK, tools=TOOLS,
                                                  tool_choice="required", max_tokens=80,
                                                  temperature=1.0, seed=seed)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        assert ch.message.content is None
        assert len(ch.message.tool_calls) == 1
        check_call(ch.message.tool_calls[0])


def test_named_tool_choice_calls_that_tool(engine_client):
    r = engine_client.chat.completions.create(
        model=TIER, messages=ASK, tools=TOOLS, max_tokens=80, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_time"
    assert check_call(call) == {}
    with pytest.raises(openai.BadRequestError) as ei:
        engine_client.chat.completions.create(
            model=TIER, messages=ASK, tools=TOOLS, max_tokens=8,
            tool_choice={"type": "function", "function": {"name": "nope"}})
    assert ei.value.body["param"] == "tool_choice"


def test_auto_answers_are_text_or_valid_calls(engine_client):
    calls = texts = 0
    for seed in range(3):
        r = engine_client.chat.completions.create(model=TIER, messages=ASK, tools=TOOLS,
                                                  max_tokens=80, temperature=1.0, seed=seed)
        ch = r.choices[0]
        if ch.message.tool_calls:
            assert ch.finish_reason == "tool_calls"
            check_call(ch.message.tool_calls[0])
            calls += 1
        else:
            assert isinstance(ch.message.content, str)
            assert "<tool_call>" not in ch.message.content or ch.finish_reason == "length"
            texts += 1
    assert calls + texts == 3


def test_streamed_call_is_one_tool_calls_delta(engine_client):
    deltas, finish, content = [], None, []
    for chunk in engine_client.chat.completions.create(model=TIER, messages=ASK, tools=TOOLS,
                                                       tool_choice="required", max_tokens=80,
                                                       temperature=0, stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        if d.tool_calls:
            deltas.extend(d.tool_calls)
        if d.content:
            content.append(d.content)
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and not content
    assert len(deltas) == 1 and deltas[0].index == 0
    whole = engine_client.chat.completions.create(model=TIER, messages=ASK, tools=TOOLS,
                                                  tool_choice="required", max_tokens=80,
                                                  temperature=0)
    call = whole.choices[0].message.tool_calls[0]
    assert deltas[0].function.name == call.function.name
    assert deltas[0].function.arguments == call.function.arguments
    # Text under auto streams as text (tool_choice none: no tools in the prompt at all).
    pieces = [c.choices[0].delta.content or "" for c in engine_client.chat.completions.create(
        model=TIER, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=12, temperature=0,
        stream=True) if c.choices]
    assert "".join(pieces)


def test_tool_results_go_back_into_the_conversation(engine_client):
    first = engine_client.chat.completions.create(model=TIER, messages=ASK, tools=TOOLS,
                                                  tool_choice="required", max_tokens=80,
                                                  temperature=0)
    call = first.choices[0].message.tool_calls[0]
    msgs = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id,
                   "content": json.dumps({"temperature": 18, "sky": "clear"})}]
    second = engine_client.chat.completions.create(model=TIER, messages=msgs, tools=TOOLS,
                                                   tool_choice="none", max_tokens=40,
                                                   temperature=0)
    assert second.choices[0].message.content
    # the call and its result are in the prompt (tool_choice none: the tool block is not), so
    # it is longer than the question alone
    plain = engine_client.chat.completions.create(model=TIER, messages=ASK, max_tokens=1,
                                                  temperature=0)
    assert second.usage.prompt_tokens > plain.usage.prompt_tokens + 20


def test_bad_tools_are_400(engine_client):
    with pytest.raises(openai.BadRequestError) as ei:
        engine_client.chat.completions.create(
            model=TIER, messages=ASK, max_tokens=8, tool_choice="required",
            tools=[{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"x": {"type": "string", "pattern": "a+"}}}}}])
    assert ei.value.body["param"] == "tools"
    assert "'pattern'" in ei.value.body["message"]


def test_langchain_bind_tools(engine_gateway):
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(model=TIER, base_url=engine_gateway.http + "/v1", api_key="sk-test-a",
                     temperature=0, max_tokens=80, max_retries=0)
    msg = llm.bind_tools(TOOLS, tool_choice="get_weather").invoke("Weather in Oslo?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
    jsonschema.validate(msg.tool_calls[0]["args"], WEATHER)
