"""The shipped config (policies/llmgw.yaml, as scripts/run starts it: two engine tiers, the
semantic cache with its encoder and verifier, the routing policy) answers what issue 19 found
broken, through the official openai SDK: the Responses API, JSON on an engine tier, and a
request with tools routed to an engine tier. Only the listeners (free ports) and the relative
paths (made absolute) differ from the file."""
import json

import jsonschema
import pytest
import yaml

from llmgw_it import ROOT, Gateway, free_port

KEY = "sk-llmgw-dev-0000"   # the shipped dev key


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    policies = ROOT / "policies"
    cfg = yaml.safe_load((policies / "llmgw.yaml").read_text())
    cfg["listen"] = [{"address": "127.0.0.1:%d" % free_port()}]
    for t in cfg["tiers"]:
        if "model_path" in t:
            t["model_path"] = str((policies / t["model_path"]).resolve())
    cfg["encoder"]["model_dir"] = str((policies / cfg["encoder"]["model_dir"]).resolve())
    if "verifier" in cfg.get("cache", {}):
        cfg["cache"]["verifier"] = str((policies / cfg["cache"]["verifier"]).resolve())
    cfg["policy"] = str((policies / cfg["policy"]).resolve())
    gw = Gateway(tmp_path_factory.mktemp("shipped"), cfg, dev_tls=False).start()
    yield gw
    assert gw.stop() == 0, gw.log_tail()


@pytest.fixture
def sdk(shipped):
    c = shipped.client(api_key=KEY, timeout=120)
    yield c
    c.close()


def test_responses_api_answers(sdk):
    r = sdk.responses.create(model="gpt-4o-mini", input="hi", max_output_tokens=16)
    assert r.object == "response" and r.output_text


def test_json_on_an_engine_tier(sdk):
    schema = {"type": "object", "properties": {"greeting": {"type": "string", "maxLength": 30}},
              "required": ["greeting"], "additionalProperties": False}
    r = sdk.chat.completions.create(
        model="gpt-4o-mini", max_tokens=60, temperature=0,
        messages=[{"role": "user", "content": "Greet me in JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "greeting",
                                                                "schema": schema}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = sdk.chat.completions.create(model="gpt-4o", max_tokens=120, temperature=0,
                                    messages=[{"role": "user", "content": "A JSON object, please."}],
                                    response_format={"type": "json_object"})
    text = r.choices[0].message.content
    assert text.lstrip().startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_tools_on_the_routed_tier(shipped, sdk):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string",
                                                                 "maxLength": 30}},
                       "required": ["city"], "additionalProperties": False}}}]
    for model in ("auto", "gpt-4o-mini"):
        raw = sdk.chat.completions.with_raw_response.create(
            model=model, max_tokens=60, temperature=0, tools=tools, tool_choice="required",
            messages=[{"role": "user", "content": "What is the weather in Lima?"}])
        assert raw.headers["x-llmgw-tier"] in ("small", "large")
        ch = raw.parse().choices[0]
        assert ch.finish_reason == "tool_calls"
        assert json.loads(ch.message.tool_calls[0].function.arguments)["city"]
