"""LangChain (`langchain-openai`'s ChatOpenAI) as a client of llmgw: invoke, stream and batch, on
an engine tier (the session's engine gateway, greedy so that answers repeat) and on an upstream
tier (the main gateway's stub upstreams, whose replies are known exactly).

langchain-openai is a test dependency (scripts/setup installs it): when it cannot be imported,
these tests fail rather than skip.
"""

import pytest

from llmgw_it import expected, uniq

try:
    from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI
    IMPORT_ERROR = None
except ImportError as e:  # reported by every test, as a failure
    IMPORT_ERROR = e

API_KEY = "sk-test-a"


@pytest.fixture(autouse=True)
def _langchain_installed():
    if IMPORT_ERROR is not None:
        pytest.fail("langchain-openai is not importable (%s) -- scripts/setup installs it "
                    "(python3 -m pip install langchain-openai)" % IMPORT_ERROR, pytrace=False)


def chat_model(gw, model, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_retries", 0)
    kw.setdefault("timeout", 60)
    return ChatOpenAI(model=model, base_url=gw.http + "/v1", api_key=API_KEY, **kw)


def streamed(llm, messages):
    """The streamed chunks' text joined, and the number of chunks."""
    chunks = list(llm.stream(messages))
    assert chunks, "the stream yielded nothing"
    assert all(isinstance(c, AIMessageChunk) for c in chunks)
    return "".join(c.content for c in chunks), len(chunks)


# ------------------------------------------------------------------ engine tier

def engine_q():
    return [SystemMessage("You are a helpful assistant."), HumanMessage("Name three colors of the rainbow.")]


@pytest.mark.parametrize("model", ["small", "gpt-4o-mini"])
def test_engine_invoke_equals_stream(engine_gateway, model):
    llm = chat_model(engine_gateway, model, max_tokens=12)
    q = engine_q()
    msg = llm.invoke(q)
    assert isinstance(msg, AIMessage)
    assert isinstance(msg.content, str) and msg.content.strip(), msg
    meta = msg.response_metadata
    assert meta.get("finish_reason") in ("stop", "length"), meta
    assert meta.get("model_name") == model, meta
    usage = msg.usage_metadata
    assert usage and 1 <= usage["output_tokens"] <= 12 and usage["input_tokens"] > 5, usage
    # greedy: a second call and the stream give the same text
    assert llm.invoke(q).content == msg.content
    text, n = streamed(llm, q)
    assert text == msg.content, "stream %r != invoke %r" % (text, msg.content)
    assert n >= 2, "the answer came in %d chunk(s): not streamed" % n


def test_engine_batch_in_order(engine_gateway):
    llm = chat_model(engine_gateway, "small", max_tokens=8)
    questions = ["What is the capital of France?", "Name a large animal.", "What color is grass?"]
    inputs = [[HumanMessage(q)] for q in questions]
    solo = [llm.invoke(m).content for m in inputs]
    out = llm.batch(inputs, config={"max_concurrency": 3})
    assert len(out) == len(inputs)
    assert [m.content for m in out] == solo, "batch answers are not the solo answers in input order"


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_engine_emoji_cut_by_max_tokens(engine_gateway, max_tokens):
    """A short max_tokens on an emoji answer cuts it mid-character on the engine side: the client
    must get text it can decode (no UnicodeDecodeError), the stream equal to invoke."""
    llm = chat_model(engine_gateway, "small", max_tokens=max_tokens)
    q = [HumanMessage("Reply with only the emoji 🎉")]
    msg = llm.invoke(q)
    assert isinstance(msg.content, str)
    msg.content.encode("utf-8")  # no lone surrogates either
    text, _ = streamed(llm, q)
    assert text == msg.content
    assert msg.response_metadata.get("finish_reason") in ("stop", "length")


# ------------------------------------------------------------------ upstream tier (stub)

def test_upstream_invoke_and_stream(gateway):
    llm = chat_model(gateway, "gpt-4o-mini", max_tokens=64)
    marker = uniq("lc")
    q = [HumanMessage("hello from langchain " + marker)]
    msg = llm.invoke(q)
    assert msg.content == expected("alpha", "hello from langchain " + marker)
    text, n = streamed(llm, q)
    assert text == msg.content
    assert n >= 2, "the stub's answer came in %d chunk(s): not streamed" % n


def test_upstream_batch_in_order(gateway):
    llm = chat_model(gateway, "gpt-4o-mini", max_tokens=64)
    texts = ["batch %d %s" % (i, uniq("lc")) for i in range(5)]
    out = llm.batch([[HumanMessage(t)] for t in texts], config={"max_concurrency": 5})
    assert [m.content for m in out] == [expected("alpha", t) for t in texts]


def test_upstream_unicode_round_trip(gateway):
    llm = chat_model(gateway, "gpt-4o-mini", max_tokens=64)
    t = "emoji 🎉🌊 and 日本語 " + uniq("lc")
    assert llm.invoke([HumanMessage(t)]).content == expected("alpha", t)
    assert streamed(llm, [HumanMessage(t)])[0] == expected("alpha", t)
