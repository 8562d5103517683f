"""The semantic cache end to end: two llmgw replicas sharing entries through a real redis-server,
the in-process MiniLM encoder, a real stub upstream, and the official openai SDK as the client.

Each test asks questions with a unique marker so that tests never meet each other's entries.
"""

import base64
import json
import re
import os
import shutil
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from llmgw_it import (ROOT, Gateway, Stub, base_config, free_port, metric_sum, metric_value, uniq,
                      wait_until)

ENCODER_DIR = Path(os.environ.get("LLMGW_ENCODER_MODEL") or ROOT / "models" / "all-MiniLM-L6-v2")
# The shipped settings that decide a semantic hit (policies/llmgw.yaml: cache.threshold, the
# cosine floor; cache.verifier, its weights; max_false_hit_rate; candidates), so the tests run
# what ships and follow recalibrations.
_SHIPPED = re.search(r"^cache:\n((?: .*\n|\n)*)", (ROOT / "policies" / "llmgw.yaml").read_text(),
                     re.M).group(1)
THRESHOLD = float(re.search(r"^  threshold: *([0-9.]+)", _SHIPPED, re.M).group(1))
_VERIFIER = re.search(r"^  verifier: *(\S+)", _SHIPPED, re.M)
VERIFIER = str(ROOT / "policies" / _VERIFIER.group(1)) if _VERIFIER else None
SHIPPED_CACHE = {"threshold": THRESHOLD}
if VERIFIER:
    SHIPPED_CACHE["verifier"] = VERIFIER
    for _k in ("max_false_hit_rate", "candidates"):
        _m = re.search(r"^  %s: *([0-9.]+)" % _k, _SHIPPED, re.M)
        if _m:
            SHIPPED_CACHE[_k] = float(_m.group(1)) if "." in _m.group(1) else int(_m.group(1))
# A paraphrase (contraction, case, punctuation) and three look-alikes at cosine 0.99 or more:
# only the first may share an answer.
PARAPHRASE = ("What is the best way to learn Java for a beginner?",
              "what's the best way to learn java for a beginner")
LOOKALIKES = [
    ("negation", "Is it safe to eat raw eggs?", "Is it not safe to eat raw eggs?"),
    ("swap", "What do Croats think of Turks?", "What do Turks think of Croats?"),
    ("identifier", "What does 0.080 inches of rain per hour feel like?",
     "What does 0.020 inches of rain per hour feel like?"),
]


class Redis:
    """A redis-server process of our own on a free port (no persistence: a restart empties it)."""

    def __init__(self, workdir):
        self.bin = shutil.which("redis-server")
        if not self.bin:
            pytest.fail("redis-server not found: scripts/setup installs the redis-server package",
                        pytrace=False)
        self.port = free_port()
        self.dir = Path(workdir)
        self.proc = None
        self.start()

    def start(self):
        self.log = open(self.dir / ("redis-%d.log" % self.port), "a")
        self.proc = subprocess.Popen([self.bin, "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(self.dir)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(lambda: self.cli("PING") == "PONG", 10, what="redis-server answers PING")

    def cli(self, *args):
        try:
            out = subprocess.run(["redis-cli", "-p", str(self.port)] + list(args), capture_output=True,
                                 text=True, timeout=5)
        except subprocess.TimeoutExpired:
            return None
        return out.stdout.strip()

    def kill(self):
        self.proc.kill()
        self.proc.wait(5)
        self.log.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(5)
        self.log.close()


def cache_config(stub, redis, ttl_s=600, prefix="llmgw:", max_temperature=0.0):
    tiers = [
        {"name": "small", "kind": "upstream", "base_url": stub.base_url, "model": "stub-small",
         "aliases": ["gpt-4o-mini"]},
        {"name": "large", "kind": "upstream", "base_url": stub.base_url, "model": "stub-large",
         "aliases": ["gpt-4o"]},
    ]
    keys = [{"key": "sk-test-a", "group": "team-a"}, {"key": "sk-test-b", "group": "team-b"}]
    cfg = base_config(free_port(), tiers=tiers, keys=keys,
                      limits={"request_timeout_ms": 30000, "read_timeout_ms": 30000})
    cfg["encoder"] = {"model_dir": str(ENCODER_DIR), "threads": 1, "batch_window_us": 500}
    cfg["cache"] = dict(SHIPPED_CACHE, enabled=True, ttl_s=ttl_s, max_mb=64,
                        max_temperature=max_temperature, guard=True)
    if redis is not None:
        cfg["cache"]["redis"] = {"host": "127.0.0.1", "port": redis.port, "prefix": prefix,
                                 "check_timeout_ms": 200}
    return cfg


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    if not (ENCODER_DIR / "model.safetensors").is_file():
        pytest.fail("encoder model not found at %s -- run scripts/fetch-models" % ENCODER_DIR,
                    pytrace=False)
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def stub(cache_dir):
    s = Stub(cache_dir, "cachestub", chunk_delay=0.001)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def redis(cache_dir):
    r = Redis(cache_dir)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def replicas(cache_dir, stub, redis):
    """Two llmgw replicas sharing one Redis."""
    a = Gateway(cache_dir / "replica-a", cache_config(stub, redis), dev_tls=False).start()
    b = Gateway(cache_dir / "replica-b", cache_config(stub, redis), dev_tls=False).start()
    for gw in (a, b):
        wait_until(lambda gw=gw: metric_sum(metrics(gw), "llmgw_cache_redis_up") == 1, 10,
                   what="replica connected to redis")
    yield a, b
    for gw in (a, b):
        assert gw.stop() == 0, gw.log_tail()


def metrics(gw):
    return requests.get(gw.http + "/metrics", timeout=5).text


LAST_HEADERS = {}


def ask(gw, text, key="sk-test-a", model="gpt-4o-mini", system=None, history=(), stream=False,
        headers=None, **kw):
    """One chat call; returns (cache header, similarity header, answer text). Its headers are
    left in LAST_HEADERS."""
    client = gw.client(api_key=key)
    msgs = []
    if system:
        msgs.append({"role": "system", "content": system})
    msgs += list(history)
    msgs.append({"role": "user", "content": text})
    kw.setdefault("temperature", 0)
    raw = client.chat.completions.with_raw_response.create(model=model, messages=msgs, stream=stream,
                                                           extra_headers=headers or {}, **kw)
    h = raw.headers
    LAST_HEADERS.clear()
    LAST_HEADERS.update({k.lower(): v for k, v in h.items()})
    out = raw.parse()
    if stream:
        parts, finish = [], None
        for chunk in out:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        assert finish is not None, "the stream ended without a finish_reason"
        text_out = "".join(parts)
    else:
        text_out = out.choices[0].message.content
    client.close()
    return h.get("x-llmgw-cache"), h.get("x-llmgw-cache-similarity"), text_out


def upstream_calls(stub, marker):
    """Requests the stub received whose body mentions marker (in any message)."""
    return sum(1 for r in stub.recorded() if marker in json.dumps(r.get("body")))


def wait_entry(gw, before):
    """Waits until gw's store holds more entries than `before` (an entry arrived from Redis)."""
    wait_until(lambda: metric_sum(metrics(gw), "llmgw_cache_entries") > before, 10,
               what="the entry reached the other replica")


# ------------------------------------------------------------------------------------ tests

def test_exact_hit_same_replica(replicas, stub):
    a, _ = replicas
    m = uniq("exact")
    q = "What is the capital city of Australia? (%s)" % m
    assert ask(a, q)[0] == "miss"
    state, sim, text = ask(a, "  what is the capital city of australia?   (%s) " % m)
    assert state == "exact"
    assert float(sim) == pytest.approx(1.0)
    assert text == "[cachestub] echo: %s" % q
    assert upstream_calls(stub, m) == 1


def test_paraphrase_on_other_replica_is_semantic_hit(replicas, stub):
    """A question answered through A; a paraphrase on B is served from A's entry. The marker
    lives in the system prompt (a namespace of this test's own), not in the questions."""
    a, b = replicas
    m = uniq("para")
    sysmsg = "You are a helpful assistant. (%s)" % m
    before = metric_sum(metrics(b), "llmgw_cache_entries") or 0
    state, _, first = ask(a, PARAPHRASE[0], system=sysmsg)
    assert state == "miss"
    wait_entry(b, before)
    state, sim, second = ask(b, PARAPHRASE[1], system=sysmsg)
    assert state == "semantic", "similarity header %r" % sim
    assert float(sim) >= THRESHOLD
    if VERIFIER:  # B verified A's entry with the token vectors that came through Redis
        conf = float(LAST_HEADERS["x-llmgw-cache-confidence"])
        assert 0 < conf <= 1
    assert second == first == "[cachestub] echo: %s" % PARAPHRASE[0]
    assert upstream_calls(stub, m) == 1


def test_other_namespaces_miss(replicas, stub):
    a, b = replicas
    m = uniq("ns")
    q = "Which planet in the solar system is the largest? %s" % m
    assert ask(a, q)[0] == "miss"
    wait_until(lambda: ask(b, q)[0] == "exact", 10, what="the entry is served by replica B")
    calls = upstream_calls(stub, m)
    # the same words under another tenant, model, system prompt or conversation: all misses
    assert ask(b, q, key="sk-test-b")[0] == "miss"
    assert ask(b, q, model="gpt-4o")[0] == "miss"
    assert ask(b, q, system="Answer like a pirate.")[0] == "miss"
    hist = [{"role": "user", "content": "Let us talk about gas giants."},
            {"role": "assistant", "content": "Sure."}]
    assert ask(b, q, history=hist)[0] == "miss"
    assert ask(b, q, max_tokens=5)[0] == "miss"
    assert upstream_calls(stub, m) == calls + 5


def test_follow_up_never_crosses_conversations(replicas):
    a, _ = replicas
    m = uniq("follow")
    conv1 = [{"role": "user", "content": "Tell me about Python, the language. %s" % m},
             {"role": "assistant", "content": "It is a programming language."}]
    conv2 = [{"role": "user", "content": "Tell me about breast cancer. %s" % m},
             {"role": "assistant", "content": "It is a disease."}]
    assert ask(a, "What are its types?", history=conv1)[0] == "miss"
    assert ask(a, "What are its types?", history=conv1)[0] == "exact"
    assert ask(a, "What are its types?", history=conv2)[0] == "miss"
    assert ask(a, "What kinds of it exist?", history=conv2)[0] in ("miss", "semantic")


def test_stream_miss_is_stored_and_replayed(replicas, stub):
    a, _ = replicas
    m = uniq("stream")
    q = "Explain how tides work on Earth. %s" % m
    state, _, streamed = ask(a, q, stream=True)
    assert state == "miss"
    state, _, replay = ask(a, q, stream=True)
    assert state == "exact"
    assert replay == streamed
    state, _, whole = ask(a, q)
    assert state == "exact" and whole == streamed
    assert upstream_calls(stub, m) == 1


def test_stream_replay_with_usage(replicas):
    a, _ = replicas
    m = uniq("usage")
    q = "Name three primary colours. %s" % m
    ask(a, q)
    client = a.client()
    chunks = list(client.chat.completions.create(
        model="gpt-4o-mini", temperature=0, messages=[{"role": "user", "content": q}], stream=True,
        stream_options={"include_usage": True}))
    client.close()
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        "[cachestub] echo: %s" % q


@pytest.mark.parametrize("reason,first,second", LOOKALIKES, ids=[x[0] for x in LOOKALIKES])
def test_lookalike_is_not_served(replicas, stub, reason, first, second):
    """A negated, role-swapped or number-changed question is as close as a paraphrase in
    embedding space, but the verifier (or, without one, the guard) refuses to serve one's answer
    for the other."""
    a, _ = replicas
    m = uniq("guard")
    sysmsg = "You are a helpful assistant. (%s)" % m
    assert ask(a, first, system=sysmsg)[0] == "miss"
    name, why = ("llmgw_cache_verifier_rejects_total", "below_threshold") if VERIFIER else \
        ("llmgw_cache_guard_rejects_total", reason)
    before = metric_value(metrics(a), name, reason=why) or 0
    assert ask(a, second, system=sysmsg)[0] == "miss"
    assert upstream_calls(stub, m) == 2
    assert metric_value(metrics(a), name, reason=why) == before + 1


def test_questions_longer_than_the_encoder_reads_get_exact_hits_only(replicas, stub):
    """The encoder reads a question's first 256 tokens. Two questions that share a long passage
    and differ after it embed alike (similarity 1, and the verifier sees the same tokens), so a
    question longer than that is never served another's answer, nor served as one: exact hits
    only (found by bench/replay: MMLU history questions on one passage)."""
    a, b = replicas
    m = uniq("long")
    sysmsg = "You are a helpful assistant. (%s)" % m
    passage = " ".join("The treaty of %d settled the border between the two kingdoms after "
                       "years of war and trade disputes." % (1500 + i) for i in range(30))
    first = passage + "\nWhich treaty came first?"
    second = passage + "\nWhich treaty came last?"
    before = metric_value(metrics(a), "llmgw_cache_too_long_total") or 0
    entries_b = metric_sum(metrics(b), "llmgw_cache_entries")
    assert ask(a, first, system=sysmsg)[0] == "miss"
    assert ask(a, second, system=sysmsg)[0] == "miss"
    assert upstream_calls(stub, m) == 2
    assert metric_value(metrics(a), "llmgw_cache_too_long_total") >= before + 2
    # The same long question again is still an exact hit, and a short question is unaffected.
    assert ask(a, first, system=sysmsg)[0] == "exact"
    assert upstream_calls(stub, m) == 2
    # Shared through Redis, it is an exact hit on the other replica too.
    wait_until(lambda: metric_sum(metrics(b), "llmgw_cache_entries") >= entries_b + 2, 10,
               what="both long questions reached the other replica")
    assert ask(b, first, system=sysmsg)[0] == "exact"
    assert upstream_calls(stub, m) == 2


# Issue 12's example: a new user's rewording of a cached question (cosine 0.91, far below the old
# 0.985). The verifier serves it, with its confidence. ("Which mountain on Earth is the tallest?"
# scores 0.85, below the 1 % point: still a miss; see tests/golden/cache/README.md.)
MOUNTAIN = "What is the tallest mountain on Earth?"
MOUNTAIN_REWORDED = ["what's the tallest mountain on earth", "WHAT IS THE TALLEST MOUNTAIN ON EARTH"]


@pytest.mark.skipif(not VERIFIER, reason="the shipped config has no verifier")
@pytest.mark.parametrize("second", MOUNTAIN_REWORDED)
def test_reworded_question_is_verified_hit(replicas, stub, second):
    a, _ = replicas
    m = uniq("mountain")
    sysmsg = "You are a helpful assistant. (%s)" % m
    assert ask(a, MOUNTAIN, system=sysmsg)[0] == "miss"
    before = metric_sum(metrics(a), "llmgw_cache_verifier_calls_total") or 0
    state, sim, text = ask(a, second, system=sysmsg)
    assert state == "semantic", (sim, LAST_HEADERS.get("x-llmgw-cache-confidence"))
    assert text == "[cachestub] echo: %s" % MOUNTAIN
    conf = float(LAST_HEADERS["x-llmgw-cache-confidence"])
    assert 0.5 < conf <= 1
    assert upstream_calls(stub, m) == 1
    text = metrics(a)
    assert metric_sum(text, "llmgw_cache_verifier_calls_total") >= before + 1
    assert metric_sum(text, "llmgw_cache_verifier_duration_seconds_count") >= 1


def test_cache_control_and_uncacheable(replicas, stub):
    a, _ = replicas
    m = uniq("cc")
    q = "What is the boiling point of water at sea level? %s" % m
    assert ask(a, q, headers={"Cache-Control": "no-store"})[0] == "miss"
    assert ask(a, q)[0] == "miss"               # no-store kept nothing: this one stores
    assert ask(a, q)[0] == "exact"
    assert ask(a, q, headers={"Cache-Control": "no-cache"})[0] == "bypass"
    assert ask(a, q, temperature=0.7)[0] == "bypass"
    assert ask(a, q, n=1, logprobs=True)[0] == "bypass"
    assert upstream_calls(stub, m) == 5


def test_upstream_error_is_not_stored(replicas, stub):
    a, _ = replicas
    m = uniq("err")
    q = "stub:status=500 %s" % m
    client = a.client()
    for _ in range(2):
        raw = client.chat.completions.with_raw_response
        with pytest.raises(Exception):
            raw.create(model="gpt-4o-mini", temperature=0, messages=[{"role": "user", "content": q}])
    client.close()
    assert upstream_calls(stub, m) == 2


def test_stream_cut_short_is_not_stored(replicas, stub):
    a, _ = replicas
    m = uniq("abort")
    q = "stub:abort=2 %s" % m
    client = a.client()
    for _ in range(2):
        try:
            for _chunk in client.chat.completions.create(model="gpt-4o-mini", temperature=0, stream=True,
                                                          messages=[{"role": "user", "content": q}]):
                pass
        except Exception:
            pass
    client.close()
    assert upstream_calls(stub, m) == 2


def test_deleted_in_redis_is_a_miss(replicas, redis, stub):
    a, b = replicas
    m = uniq("stale")
    q = "Who wrote the novel Moby-Dick? %s" % m
    assert ask(a, q)[0] == "miss"
    wait_until(lambda: ask(b, q)[0] == "exact", 10, what="the entry is served by replica B")
    # remove the entry behind the replicas' backs (no feed message): the re-check finds it gone
    keys = [k for k in redis.cli("--scan", "--pattern", "llmgw:e:*").split() if k]
    for k in keys:
        if m in (redis.cli("HGET", k, "q") or ""):
            redis.cli("DEL", k)
    assert ask(b, q)[0] == "miss"
    assert metric_sum(metrics(b), "llmgw_cache_stale_total") >= 1


def test_metrics(replicas):
    a, _ = replicas
    text = metrics(a)
    for name in ("llmgw_cache_lookups_total", "llmgw_cache_misses_total", "llmgw_cache_insertions_total",
                 "llmgw_cache_entries", "llmgw_cache_lookup_duration_seconds_count",
                 "llmgw_encoder_texts_total"):
        assert metric_sum(text, name) is not None, name
    assert metric_value(text, "llmgw_cache_hits_total", kind="exact") >= 1


def test_embeddings_endpoint(replicas):
    a, _ = replicas
    client = a.client()
    texts = ["The cat sits on the mat.", "A feline rests on a rug.", "Quarterly revenue grew 8%."]
    r = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)
    assert r.model == "all-MiniLM-L6-v2" and len(r.data) == 3 and r.usage.prompt_tokens > 3
    vecs = [d.embedding for d in r.data]
    assert all(len(v) == 384 for v in vecs)
    assert all(abs(sum(x * x for x in v) - 1) < 1e-4 for v in vecs)
    dot = lambda x, y: sum(p * q for p, q in zip(x, y))  # noqa: E731
    assert dot(vecs[0], vecs[1]) > dot(vecs[0], vecs[2]) + 0.2
    raw = requests.post(a.http + "/v1/embeddings", headers={"Authorization": "Bearer sk-test-a"}, timeout=10,
                        json={"model": "all-MiniLM-L6-v2", "input": texts[0], "encoding_format": "base64"})
    assert raw.status_code == 200
    b64 = struct.unpack("<384f", base64.b64decode(raw.json()["data"][0]["embedding"]))
    assert max(abs(x - y) for x, y in zip(b64, vecs[0])) < 1e-6
    bad = requests.post(a.http + "/v1/embeddings", headers={"Authorization": "Bearer sk-test-a"}, timeout=10,
                        json={"model": "all-MiniLM-L6-v2", "input": [[1, 2, 3]]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
    client.close()


def test_ttl_expiry(cache_dir, stub, redis):
    gw = Gateway(cache_dir / "replica-ttl", cache_config(stub, redis, ttl_s=1, prefix="ttl:"),
                 dev_tls=False).start()
    try:
        m = uniq("ttl")
        q = "How many legs does a spider have? %s" % m
        assert ask(gw, q)[0] == "miss"
        assert ask(gw, q)[0] == "exact"
        time.sleep(1.3)
        assert ask(gw, q)[0] == "miss"
        wait_until(lambda: redis.cli("--scan", "--pattern", "ttl:e:*").count(":e:") <= 1, 5,
                   what="redis expired the first entry")
    finally:
        assert gw.stop() == 0


def test_new_replica_rebuilds_from_redis(cache_dir, replicas, stub, redis):
    a, _ = replicas
    m = uniq("rebuild")
    q = "What is the speed of light in vacuum? %s" % m
    assert ask(a, q)[0] == "miss"
    c = Gateway(cache_dir / "replica-c", cache_config(stub, redis), dev_tls=False).start()
    try:
        wait_until(lambda: ask(c, q)[0] == "exact", 10, what="the new replica loaded the entry from redis")
        assert upstream_calls(stub, m) == 1
    finally:
        assert c.stop() == 0


def test_redis_killed_and_restarted(replicas, redis, stub):
    """Redis dies mid-run: no request fails (local-only); it comes back empty: sharing resumes."""
    a, b = replicas
    failures, done = [], threading.Event()
    sent = [0]

    def load():
        i = 0
        while not done.is_set():
            i += 1
            gw = a if i % 2 else b
            try:
                ask(gw, "Load question number %d about rivers. %s" % (i % 7, uniq("load")))
                sent[0] += 1
            except Exception as e:  # noqa: BLE001
                failures.append(repr(e))

    t = threading.Thread(target=load)
    t.start()
    time.sleep(0.5)
    redis.kill()
    for gw in (a, b):
        wait_until(lambda gw=gw: metric_sum(metrics(gw), "llmgw_cache_redis_up") == 0, 10,
                   what="replica saw redis go away")
    m = uniq("down")
    q = "What is the tallest mountain on Earth? %s" % m
    assert ask(a, q)[0] == "miss"
    assert ask(a, q)[0] == "exact"       # local-only still caches
    time.sleep(0.5)
    redis.start()
    for gw in (a, b):
        wait_until(lambda gw=gw: metric_sum(metrics(gw), "llmgw_cache_redis_up") == 1, 15,
                   what="replica reconnected to redis")
    time.sleep(0.3)
    done.set()
    t.join(30)
    assert failures == [], failures[:3]
    assert sent[0] > 5
    m = uniq("resumed")
    q = "How can I improve my handwriting? %s" % m
    before = metric_sum(metrics(b), "llmgw_cache_entries") or 0
    assert ask(a, q)[0] == "miss"
    wait_entry(b, before)
    assert ask(b, q)[0] == "exact"
    assert upstream_calls(stub, m) == 1


def test_contextual_follow_ups_stay_in_their_conversation(replicas, stub):
    """MeanCache's follow-ups (../shared/data/cache/contextual_queries.json): each asked under its
    own conversation is stored and then an exact hit; asked under another conversation, never a
    hit (the earlier turns are part of the namespace)."""
    a, _ = replicas
    data = json.loads((ROOT.parent / "shared" / "data" / "cache" / "contextual_queries.json").read_text())[:16]
    m = uniq("ctx")

    def conv(item):
        return [{"role": "user", "content": "%s (%s)" % (item["Main Query"], m)},
                {"role": "assistant", "content": item["Main Query Response"]}]

    for item in data:
        assert ask(a, item["Follow-Up Query"], history=conv(item))[0] == "miss"
    for item in data:
        assert ask(a, item["Follow-Up Query"], history=conv(item))[0] == "exact"
    for i, item in enumerate(data):
        other = data[(i + 1) % len(data)]
        state = ask(a, item["Follow-Up Query"], history=conv(other))[0]
        assert state == "miss", "follow-up %r under %r: %s" % (item["Follow-Up Query"], other["Main Query"], state)
    assert upstream_calls(stub, m) == 2 * len(data)


def test_encoder_wait_bound_skips_the_cache(cache_dir, stub):
    """encoder.max_wait_ms: once the encoder has measured what a text costs, a question that would
    wait longer than the bound for its vector is answered by the tier without the cache (not
    stored, counted in llmgw_encoder_rejected_total) instead of queueing behind the encoder."""
    cfg = cache_config(stub, None)
    cfg["encoder"]["max_wait_ms"] = 1  # a question costs 5-10 ms here (1.8 ms on Zen 4), more under ASan
    gw = Gateway(cache_dir / "wait-bound", cfg, dev_tls=False).start()
    try:
        first = "Which river flows through Vienna? %s" % uniq("wait")
        assert ask(gw, first)[0] == "miss"  # nothing measured yet: encoded, stored
        assert ask(gw, first)[0] == "exact"
        m = uniq("bypassed")
        second = "How tall is the tallest tree in the world? %s" % m
        state, _, text = ask(gw, second)
        assert state == "bypass" and text, (state, text)
        assert upstream_calls(stub, m) == 1
        assert metric_sum(metrics(gw), "llmgw_encoder_rejected_total") >= 1
        state, _, _ = ask(gw, second)
        assert state == "bypass"  # still refused, and nothing was stored the first time
        assert upstream_calls(stub, m) == 2
    finally:
        assert gw.stop() == 0, gw.log_tail()
