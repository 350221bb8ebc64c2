"""Property-based fuzz of the admin API: whatever the body, path or query, a worker answers
with a JSON reason and a 4xx (or success), never a 500."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from magnetar.broker import EmbeddedBroker
from tests.cluster.conftest import Cluster, Worker

FUNCTIONS = "/admin/v3/functions/public/default"
FIELDS = [
    "tenant",
    "namespace",
    "name",
    "className",
    "runtime",
    "py",
    "inputs",
    "topicsPattern",
    "customSerdeInputs",
    "inputSpecs",
    "output",
    "outputSerdeClassName",
    "logTopic",
    "processingGuarantees",
    "userConfig",
    "secrets",
    "autoAck",
    "maxMessageRetries",
    "deadLetterTopic",
    "subName",
    "subscriptionPosition",
    "retainOrdering",
    "retainKeyOrdering",
    "timeoutMs",
    "forwardSourceMessageProperty",
    "resources",
    "cleanupSubscription",
]
"""FunctionConfig fields a body may set (parallelism is fuzzed apart: it starts processes)."""

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
CONFIGS = st.one_of(
    JSON.map(json.dumps),
    st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=12), JSON, max_size=6).map(
        json.dumps
    ),
    st.builds(
        lambda field, value: json.dumps({"inputs": ["fuzz-in"], field: value}),
        st.sampled_from(FIELDS),
        JSON,
    ),
    st.text(max_size=60),
)
SEGMENTS = st.text(min_size=1, max_size=20).filter(lambda s: s not in {".", ".."})
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class Target:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.http = httpx.Client(base_url=worker.url, timeout=30)

    def check(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self.http.request(method, path, **kwargs)
        assert response.status_code < 500, (method, path, kwargs, response.text)
        if response.status_code >= 400:
            assert isinstance(response.json()["reason"], str), response.text
        return response


@pytest.fixture(scope="module")
def target(
    cluster_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    cluster = Cluster(cluster_broker.service_url, tmp_path_factory.mktemp("fuzz"))
    try:
        worker = cluster.start_worker("f0")
        found = Target(worker)
        for name, config in (
            ("stopped", {"inputs": ["fuzz-in"]}),
            ("sink", {"inputs": ["sink-in"]}),
        ):
            created = found.check(
                "POST",
                f"{FUNCTIONS}/{name}",
                data={"functionConfig": json.dumps(config)},
                files={"data": ("f.py", b"def process(input):\n    return None\n")},
            )
            assert created.status_code == 204, created.text
        found.check("POST", f"{FUNCTIONS}/stopped/stop")
        yield found
    finally:
        cluster.stop_all()


@FUZZ
@given(config=CONFIGS, url=st.none() | st.text(max_size=30))
def test_register_bodies(target: Target, config: str, url: str | None) -> None:
    form = {"functionConfig": config} | ({"url": url} if url is not None else {})
    # code that does not compile: every body is checked, no function is ever created
    target.check(
        "POST",
        f"{FUNCTIONS}/fuzz-{uuid.uuid4().hex[:6]}",
        data=form,
        files={"data": ("f.py", b"def broken(:\n")} if url is None else None,
    )


@FUZZ
@given(config=CONFIGS)
def test_update_bodies(target: Target, config: str) -> None:
    target.check("PUT", f"{FUNCTIONS}/stopped", data={"functionConfig": config})


@FUZZ
@given(parallelism=JSON)
def test_parallelism_values(target: Target, parallelism: Any) -> None:
    try:
        count = TypeAdapter(int).validate_python(parallelism)
    except ValidationError:
        count = None
    # a valid count would start that many processes; null leaves it as it is (no change)
    assume(parallelism is not None and (count is None or count < 1))
    body = json.dumps({"parallelism": parallelism})
    answer = target.check("PUT", f"{FUNCTIONS}/stopped", data={"functionConfig": body})
    assert answer.status_code == 400
    assert answer.json()["reason"].startswith("invalid function config: parallelism")


@FUZZ
@given(data=st.text(max_size=40), topic=st.none() | st.text(max_size=30))
def test_trigger_forms(target: Target, data: str, topic: str | None) -> None:
    form = {"data": data} | ({"topic": topic} if topic is not None else {})
    target.check("POST", f"{FUNCTIONS}/sink/trigger", data=form)


@FUZZ
@given(
    tenant=SEGMENTS,
    namespace=SEGMENTS,
    name=SEGMENTS,
    suffix=st.sampled_from(
        ["", "/status", "/stats", "/0/status", "/1/stats", "/start", "/restart"]
    ),
)
def test_paths(target: Target, tenant: str, namespace: str, name: str, suffix: str) -> None:
    path = "/admin/v3/functions/" + "/".join(quote(s, safe="") for s in (tenant, namespace, name))
    method = "POST" if suffix in {"/start", "/restart"} else "GET"
    target.check(method, path + suffix)


@FUZZ
@given(worker_id=st.text(max_size=20).filter(lambda w: w != "f0"))
def test_drain_queries(target: Target, worker_id: str) -> None:
    target.check("GET", "/admin/v2/worker/leader/drain", params={"workerId": worker_id})
    answer = target.check("PUT", "/admin/v2/worker/leader/drain", params={"workerId": worker_id})
    assert answer.status_code == 400
