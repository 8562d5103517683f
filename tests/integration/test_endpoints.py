"""/v1/models, /v1/completions, /v1/embeddings through the gateway."""

import base64
import struct

import pytest

from llmgw_it import expected, stub_upstream, uniq


def test_models_list_shows_tiers_and_aliases(client):
    ids = {m.id for m in client.models.list()}
    for name in ("small", "large", "primary", "backup", "flaky", "secure", "embed",
                 "gpt-4o-mini", "gpt-4o", "text-embedding-3-small"):
        assert name in ids, "%s missing from /v1/models: %s" % (name, sorted(ids))


def test_models_list_objects_are_well_formed(client):
    models = list(client.models.list())
    assert models
    for m in models:
        assert m.object == "model"
        assert isinstance(m.created, int)
        assert isinstance(m.owned_by, str)


def test_completions_non_stream(client, stub_a):
    marker = uniq()
    raw = client.completions.with_raw_response.create(model="small", prompt="complete " + marker, max_tokens=16)
    completion = raw.parse()
    assert completion.object == "text_completion"
    assert completion.choices[0].text == expected("alpha", "complete " + marker)
    assert raw.headers.get("x-llmgw-tier") == "small"
    up = stub_a.requests_with(marker)
    assert len(up) == 1 and up[0]["path"] == "/v1/completions" and up[0]["model"] == "stub-small"


def _as_floats(embedding):
    if isinstance(embedding, str):  # explicit encoding_format="base64" is handed back undecoded
        n = len(base64.b64decode(embedding)) // 4
        return list(struct.unpack("<%df" % n, base64.b64decode(embedding)))
    return list(embedding)


@pytest.mark.parametrize("fmt", ["float", "base64", None])
def test_embeddings_list_input(client, stub_a, fmt):
    marker = uniq()
    inputs = ["alpha " + marker, "beta " + marker, "gamma"]
    kw = {"encoding_format": fmt} if fmt else {}  # None: the SDK asks for base64 and decodes it
    res = client.embeddings.create(model="text-embedding-3-small", input=inputs, **kw)
    assert [d.index for d in res.data] == [0, 1, 2]
    for d, text in zip(res.data, inputs):
        vec = _as_floats(d.embedding)
        assert len(vec) == stub_upstream.EMBED_DIM
        assert vec == pytest.approx(stub_upstream.fake_embedding(text), abs=1e-6)
    up = stub_a.requests_with(marker)
    assert len(up) == 1 and up[0]["path"] == "/v1/embeddings" and up[0]["model"] == "stub-embed"


def test_embeddings_single_string(client):
    res = client.embeddings.create(model="embed", input="just one", encoding_format="float")
    assert len(res.data) == 1
    assert res.data[0].embedding == pytest.approx(stub_upstream.fake_embedding("just one"), abs=1e-6)
    assert res.usage.total_tokens == 2
