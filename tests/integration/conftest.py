"""Fixtures for the llmgw real-process integration tests (see llmgw_it.py)."""

import os
import socket

import pytest

# Engine tests compare batched, preempted and solo runs token for token. The default CPU kernels
# sum a token's dot products in another order when several tokens share a matmul (the fast
# prefill tiles), so those runs may differ by rounding; the batch-invariant kernels make them
# identical bit for bit. (The fast kernels are tested against references in tests/unit.)
os.environ.setdefault("LLMGW_KERNELS", "invariant")

from llmgw_it import (Gateway, Stub, _running_gateways, base_config, engine_config, engine_tier, free_port,
                      make_cert, require_engine_model)

# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("llmgw-it")


@pytest.fixture(scope="session")
def stub_cert(workdir):
    return make_cert(workdir / "stub-tls")


@pytest.fixture(scope="session")
def stub_a(workdir):
    s = Stub(workdir, "alpha", api_key="sk-up-alpha")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def stub_b(workdir):
    s = Stub(workdir, "beta")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def stub_tls(workdir, stub_cert):
    s = Stub(workdir, "secure", tls=stub_cert)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def dead_port():
    """A port that refuses connections: bound (so nobody else gets it) but not listening."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


@pytest.fixture(scope="session")
def gateway_config(workdir, stub_a, stub_b, stub_tls, stub_cert, dead_port):
    tiers = [
        {"name": "small", "kind": "upstream", "base_url": stub_a.base_url, "api_key": "sk-up-alpha",
         "model": "stub-small", "aliases": ["gpt-4o-mini"], "connect_timeout_ms": 2000,
         "timeout_ms": 60000, "max_connections": 256, "retries": 1},
        {"name": "large", "kind": "upstream", "base_url": stub_b.base_url, "aliases": ["gpt-4o"]},
        {"name": "primary", "kind": "upstream", "base_url": "http://127.0.0.1:%d/v1" % dead_port,
         "model": "stub-primary", "connect_timeout_ms": 500, "retries": 1, "fallback": "backup"},
        {"name": "backup", "kind": "upstream", "base_url": stub_b.base_url, "model": "stub-backup"},
        {"name": "flaky", "kind": "upstream", "base_url": stub_a.base_url, "api_key": "sk-up-alpha",
         "model": "stub-flaky", "fallback": "backup"},
        {"name": "secure", "kind": "upstream", "base_url": stub_tls.base_url, "model": "stub-secure",
         "tls_verify": True, "ca_file": str(stub_cert[0])},
        {"name": "secure-noverify", "kind": "upstream", "base_url": stub_tls.base_url,
         "model": "stub-secure-noverify", "tls_verify": False},
        {"name": "secure-untrusted", "kind": "upstream", "base_url": stub_tls.base_url,
         "model": "stub-secure-untrusted", "tls_verify": True, "connect_timeout_ms": 2000},
        {"name": "slow", "kind": "upstream", "base_url": stub_b.base_url, "model": "stub-slow",
         "timeout_ms": 1000},
        {"name": "embed", "kind": "upstream", "base_url": stub_a.base_url, "api_key": "sk-up-alpha",
         "model": "stub-embed", "aliases": ["text-embedding-3-small"]},
    ]
    keys = [
        {"key": "sk-test-a", "group": "team-a"},
        {"key": "sk-test-b", "group": "team-b", "rate_limit": {"requests_per_second": 1000, "burst": 1000}},
        {"key": "sk-test-rl", "group": "team-rl", "rate_limit": {"requests_per_second": 1, "burst": 2}},
    ]
    return base_config(free_port(), free_port(), tiers=tiers, keys=keys)


@pytest.fixture(scope="session")
def gateway(workdir, gateway_config):
    gw = Gateway(workdir / "gw-main", gateway_config)
    gw.start()
    yield gw
    rc = gw.stop()
    assert rc == 0, "llmgw did not exit 0 after SIGTERM at session end (rc=%r)\nlog:\n%s" % (rc, gw.log_tail())


@pytest.fixture
def client(gateway):
    c = gateway.client()
    yield c
    c.close()


@pytest.fixture(scope="session")
def engine_model():
    """The GGUF file engine tiers serve (models/SmolLM2-135M-Instruct.Q4_1.gguf)."""
    return require_engine_model()


@pytest.fixture(scope="session")
def engine_gateway(workdir, engine_model):
    """An llmgw whose tier `small` (alias gpt-4o-mini) is an engine tier on 2 CPU threads."""
    cfg = engine_config(free_port(), [engine_tier("small", engine_model, threads=2, context=2048,
                                                  max_batch_tokens=256, max_seqs=32)],
                        kv_pool_mb=256, kv_page_kb=256)
    gw = Gateway(workdir / "gw-engine", cfg, dev_tls=False)
    gw.start()
    yield gw
    rc = gw.stop()
    assert rc == 0, "engine llmgw did not exit 0 after SIGTERM at session end (rc=%r)\nlog:\n%s" % (
        rc, gw.log_tail())


@pytest.fixture
def engine_client(engine_gateway):
    c = engine_gateway.client(timeout=60)
    yield c
    c.close()


@pytest.fixture
def gateway_factory(tmp_path):
    """Start extra, test-private llmgw processes; they are stopped at test end."""
    started = []

    def make(config, dev_tls=True):
        gw = Gateway(tmp_path / ("gw%d" % len(started)), config, dev_tls=dev_tls)
        started.append(gw)
        return gw.start()

    yield make
    for gw in started:
        gw.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and _running_gateways:
        for gw in list(_running_gateways):
            rep.sections.append(("llmgw log tail (%s)" % gw.dir.name, gw.log_tail(40)))


