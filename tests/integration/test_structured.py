"""Structured outputs on an engine tier (issue 19): response_format json_object and json_schema
constrain decoding (engine/text/grammar.h), so every answer that ends on its own parses, and
validates against its schema by the `jsonschema` package (the oracle: nobody here wrote it).
Through the official openai SDK (raw, `parse` with a pydantic model, streamed, n > 1, many
seeds) and langchain-openai's with_structured_output."""
import json
from typing import List, Optional

import jsonschema
import openai
import pydantic
import pytest

TIER = "gpt-4o-mini"   # the engine tier `small` (SmolLM2-135M-Instruct)

PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "hobbies", "mood", "nickname"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "age": {"type": "integer"},
        "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
        "mood": {"enum": ["happy", "sad", "calm"]},
        "nickname": {"type": ["string", "null"]},
        "birthday": {"type": "string", "format": "date"},
        "address": {"type": "object", "additionalProperties": False,
                    "required": ["city", "zip"],
                    "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}}},
    },
}

ASK = [{"role": "user", "content": "Describe a fictional person as JSON."}]


def schema_format(schema, name="person"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def validate(text, schema):
    doc = json.loads(text)
    jsonschema.validate(doc, schema, format_checker=jsonschema.FormatChecker())
    return doc


def test_json_schema_answers_validate_over_many_seeds(engine_client):
    whole, total = 0, 0
    for seed in range(3):
        r = engine_client.chat.completions.create(
            model=TIER, messages=ASK, max_tokens=140, temperature=1.0, seed=seed, n=4,
            response_format=schema_format(PERSON))
        for ch in r.choices:
            total += 1
            if ch.finish_reason == "stop":
                validate(ch.message.content, PERSON)
                whole += 1
            else:   # cut by max_tokens: still a prefix of a valid document
                assert ch.finish_reason == "length"
    assert whole >= total // 2, "%d of %d answers ended on their own" % (whole, total)
    greedy = engine_client.chat.completions.create(
        model=TIER, messages=ASK, max_tokens=160, temperature=0,
        response_format=schema_format(PERSON))
    assert greedy.choices[0].finish_reason == "stop"
    validate(greedy.choices[0].message.content, PERSON)


def test_json_object_is_an_object_streamed_or_not(engine_client):
    fmt = {"type": "json_object"}
    msgs = [{"role": "user", "content": "Give me a JSON object with the name and colour of a cat."}]
    # greedy: streamed and not, the same text (the 135M model may ramble until max_tokens: its
    # answer is then a cut document, which is why only whole answers are parsed below)
    r = engine_client.chat.completions.create(model=TIER, messages=msgs, max_tokens=60,
                                              temperature=0, response_format=fmt)
    pieces, finish = [], None
    for ch in engine_client.chat.completions.create(model=TIER, messages=msgs, max_tokens=60,
                                                    temperature=0, response_format=fmt,
                                                    stream=True):
        if ch.choices:
            pieces.append(ch.choices[0].delta.content or "")
            finish = ch.choices[0].finish_reason or finish
    assert finish == r.choices[0].finish_reason
    assert "".join(pieces) == r.choices[0].message.content
    assert r.choices[0].message.content.lstrip().startswith("{")
    whole = 0
    for seed in range(2):
        s = engine_client.chat.completions.create(model=TIER, messages=msgs, max_tokens=120,
                                                  temperature=1.0, seed=seed, n=4,
                                                  response_format=fmt)
        for ch in s.choices:
            if ch.finish_reason == "stop":
                assert isinstance(json.loads(ch.message.content), dict)
                whole += 1
    assert whole >= 2, "only %d of 8 sampled answers ended on their own" % whole


class Address(pydantic.BaseModel):
    city: str
    zip: int


class Person(pydantic.BaseModel):
    name: str
    age: int
    pets: List[str] = pydantic.Field(max_length=3)   # maxItems: the 135M model loops on lists
    address: Address
    nickname: Optional[str]


def _parse(client, **kw):
    # openai >= 1.92 has chat.completions.parse; older releases only the beta one.
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    return parse(**kw)


def test_sdk_parse_with_a_pydantic_model(engine_client):
    r = _parse(engine_client, model=TIER, messages=ASK, max_tokens=200, temperature=0,
               response_format=Person)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(msg.parsed, Person), msg.content
    # the schema the SDK sent (strict: additionalProperties false, every property required)
    schema = openai.lib._pydantic.to_strict_json_schema(Person)
    validate(msg.content, schema)


def test_langchain_with_structured_output(engine_gateway):
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(model=TIER, base_url=engine_gateway.http + "/v1", api_key="sk-test-a",
                     temperature=0, max_tokens=200, max_retries=0)
    out = llm.with_structured_output(Person, method="json_schema").invoke(
        "Describe a fictional person.")
    assert isinstance(out, Person)


@pytest.mark.parametrize("schema,needle", [
    ({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$"}}},
     "'pattern'"),
    ({"anyOf": [{"type": "object"}, {"type": "object", "required": ["a"]}]}, "begin alike"),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}}, "'minimum'"),
])
def test_unsupported_schema_parts_are_400_naming_them(engine_client, schema, needle):
    with pytest.raises(openai.BadRequestError) as ei:
        engine_client.chat.completions.create(model=TIER, messages=ASK, max_tokens=8,
                                              response_format=schema_format(schema))
    body = ei.value.body
    assert body["param"] == "response_format.json_schema.schema"
    assert needle in body["message"], body["message"]


@pytest.mark.parametrize("fmt,param", [
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
     "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}},
     "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": []}},
     "response_format.json_schema.schema"),
    ({"type": "xml"}, "response_format.type"),
])
def test_malformed_response_format_is_400(engine_client, fmt, param):
    with pytest.raises(openai.BadRequestError) as ei:
        engine_client.chat.completions.create(model=TIER, messages=ASK, max_tokens=8,
                                              response_format=fmt)
    assert ei.value.body["param"] == param
