"""JavaScript functions through a worker: registered over the REST API (multipart
``functionConfig`` + a ``.js`` file), run in instance processes, reported in status."""

from __future__ import annotations

import collections
import json
import uuid
from typing import Any
from urllib.parse import urlsplit

import httpx
import pulsar

from tests.cluster.conftest import Cluster, Worker, wait_until
from tests.cluster.test_cluster import running
from tests.http_endpoint import http_endpoint
from tests.integration.conftest import collect, produce, values


def create_js(
    cluster: Cluster, worker: Worker, name: str, source: bytes, filename: str, **config: Any
) -> httpx.Response:
    body = {"tenant": "public", "namespace": "default", "name": name, **config}
    return httpx.post(
        f"{worker.url}/admin/v3/functions/public/default/{name}",
        data={"functionConfig": json.dumps(body)},
        files={"data": (filename, source)},
        timeout=30,
    )


def test_javascript_function_runs_on_a_worker(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    worker = cluster.start_worker("w1")
    topic = f"js-{uuid.uuid4().hex[:6]}"
    created = cluster.create(
        worker,
        "excl-js",
        "exclamation.js",
        inputs=[topic],
        output=f"{topic}-out",
        parallelism=2,
        subscriptionPosition="Earliest",
    )
    assert created.status_code == 204, created.text
    config = cluster.get(worker, "/admin/v3/functions/public/default/excl-js")
    assert config["js"] == "exclamation.js" and "py" not in config  # runtime: JAVASCRIPT
    wait_until(lambda: running(cluster, worker, "excl-js") == 2, 30, "two instances running")
    produce(cluster_client, topic, [f"m{i}" for i in range(50)])
    assert sorted(values(collect(cluster_client, f"{topic}-out", 50, timeout=30))) == sorted(
        f"m{i}!" for i in range(50)
    )


def test_bad_scripts_are_rejected_with_400(cluster: Cluster) -> None:
    worker = cluster.start_worker("w1")
    cases = {
        b"function process(input) {\n  return input +;\n}\n": (
            "syntax error in bad.js, line 2, column 17: SyntaxError: Unexpected token ';'"
        ),
        b"function transform(input) { return input; }\n": (
            "bad.js defines no function 'process'; it defines: transform"
        ),
        b"throw new Error('not configured');\n": (
            "the top-level code of bad.js threw: Error: not configured"
        ),
    }
    for source, reason in cases.items():
        answer = create_js(cluster, worker, "bad", source, "bad.js", inputs=["in"])
        assert answer.status_code == 400, answer.text
        assert reason in answer.json()["reason"]
    mismatch = create_js(
        cluster,
        worker,
        "bad",
        b"function process(i) { return i; }",
        "bad.js",
        inputs=["in"],
        runtime="PYTHON",
    )
    assert mismatch.status_code == 400
    assert "js is set but runtime is PYTHON" in mismatch.json()["reason"]
    serde = create_js(
        cluster,
        worker,
        "bad",
        b"function process(i) { return i; }",
        "bad.js",
        inputs=["in"],
        outputSerdeClassName="serde.JsonSerDe",
    )
    assert serde.status_code == 400
    assert "'string' (the default) or 'json'" in serde.json()["reason"]
    listed = httpx.get(f"{worker.url}/admin/v3/functions/public/default", timeout=10).json()
    assert "bad" not in listed


def test_thrown_errors_and_timeouts_show_in_status_and_the_instance_runs_on(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    worker = cluster.start_worker("w1")
    topic = f"js-{uuid.uuid4().hex[:6]}"
    created = cluster.create(
        worker,
        "fragile-js",
        "fragile.js",
        inputs=[topic],
        output=f"{topic}-out",
        timeoutMs=300,
        processingGuarantees="ATMOST_ONCE",
        subscriptionPosition="Earliest",
    )
    assert created.status_code == 204, created.text
    wait_until(lambda: running(cluster, worker, "fragile-js") == 1, 30, "instance running")
    produce(cluster_client, topic, ["a", "boom", "hang", "b"])
    assert values(collect(cluster_client, f"{topic}-out", 2, timeout=30)) == ["A", "B"]

    def instance() -> dict[str, Any]:
        status: dict[str, Any] = cluster.status(worker, "fragile-js")["instances"][0]["status"]
        return status

    wait_until(lambda: instance()["numUserExceptions"] == 2, 15, "two user exceptions")
    errors = [e["exceptionString"] for e in instance()["latestUserExceptions"]]
    assert errors[0].startswith('Error: cannot handle "boom"\n    at process (fragile.js:5:')
    assert errors[1] == "the function ran longer than its timeout of 300 ms"
    assert instance()["running"] and instance()["numSuccessfullyProcessed"] == 2


def test_word_count_with_counters_on_a_worker(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    worker = cluster.start_worker("w1")
    topic = f"js-words-{uuid.uuid4().hex[:6]}"
    created = cluster.create(
        worker,
        "wc-js",
        "word_count.js",
        inputs=[topic],
        output=f"{topic}-out",
        subscriptionPosition="Earliest",
    )
    assert created.status_code == 204, created.text
    wait_until(lambda: running(cluster, worker, "wc-js") == 1, 30, "instance running")
    lines = [f"the fox n{i % 7} the end" for i in range(200)]
    produce(cluster_client, topic, lines)
    answers = values(collect(cluster_client, f"{topic}-out", 200, timeout=30))
    assert sorted(answers, key=lambda a: int(a.split("=")[1])) == [
        f"the={2 * i}" for i in range(1, 201)
    ]
    expected = collections.Counter(word for line in lines for word in line.split())

    def counts() -> dict[str, int]:
        found = {}
        for word in expected:
            response = httpx.get(
                f"{worker.url}/admin/v3/functions/public/default/wc-js/state/{word}", timeout=30
            )
            if response.status_code == 200:
                found[word] = response.json()["numberValue"]
        return found

    wait_until(lambda: counts() == dict(expected), 30, "exact counts in the state store")


def test_url_bindings_over_rest_reach_the_endpoint_and_bad_ones_are_a_400(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    topic = f"js-curl-{uuid.uuid4().hex[:6]}"
    source = b"function process(input) { return curl('GET', api, {path: input}).body.path; }"
    with http_endpoint() as endpoint:
        # the operator lets bindings reach the test's server (127.0.0.1) as well as public
        # hosts, and opens its port of this host to instances
        cluster.env["MAGNETAR_URL_BINDING_HOSTS"] = "public,127.0.0.1"
        cluster.env["MAGNETAR_INSTANCE_HOST_PORTS"] = str(urlsplit(endpoint.base).port)
        worker = cluster.start_worker("w1")
        binding = {
            "alias": "api",
            "url": f"{endpoint.base}/api",
            "auth": {"type": "bearer", "secret": "apiToken"},
            "timeoutMs": 2000,
        }
        created = create_js(
            cluster,
            worker,
            "curl-js",
            source,
            "curl.js",
            inputs=[topic],
            output=f"{topic}-out",
            secrets={"apiToken": "t0ken"},
            urlBindings=[binding],
            subscriptionPosition="Earliest",
        )
        assert created.status_code == 204, created.text
        config = cluster.get(worker, "/admin/v3/functions/public/default/curl-js")
        assert config["urlBindings"] == [binding]  # names the secret, never its value
        assert config["secrets"] == {"apiToken": "******"}
        wait_until(lambda: running(cluster, worker, "curl-js") == 1, 30, "instance running")
        produce(cluster_client, topic, ["one", "two"])
        answers = values(collect(cluster_client, f"{topic}-out", 2, timeout=30))
        assert sorted(answers) == ["/api/one", "/api/two"]
        assert {r["authorization"] for r in endpoint.seen.requests} == {"Bearer t0ken"}
    bad = [
        ([{"alias": "api", "url": "file:///etc/passwd"}], "must be an http:// or https:// URL"),
        ([{**binding, "auth": {"type": "oauth"}}], "auth.type 'oauth' is not supported"),
        ([{**binding, "auth": {"type": "bearer"}}], "bearer authentication needs secret"),
        ([binding, binding], "urlBindings[1].alias 'api' is declared twice"),
        (
            [{"alias": "api", "url": "http://10.0.0.7/"}],
            "urlBindings[0] (api, http://10.0.0.7/): host 10.0.0.7 is a private address, which "
            "the worker's url_binding_hosts (public, 127.0.0.1) does not allow",
        ),
    ]
    for bindings, reason in bad:
        answer = create_js(
            cluster,
            worker,
            "curl-bad",
            source,
            "curl.js",
            inputs=["in"],
            secrets={"apiToken": "t0ken"},
            urlBindings=bindings,
        )
        assert answer.status_code == 400, answer.text
        assert reason in answer.json()["reason"]
    updated = httpx.put(
        f"{worker.url}/admin/v3/functions/public/default/curl-js",
        data={"functionConfig": json.dumps({"urlBindings": [binding, binding]})},
        timeout=30,
    )
    assert updated.status_code == 400
    assert "urlBindings[1].alias 'api' is declared twice" in updated.json()["reason"]
    metadata = {"alias": "api", "url": "http://169.254.169.254/latest/meta-data"}
    updated = httpx.put(
        f"{worker.url}/admin/v3/functions/public/default/curl-js",
        data={"functionConfig": json.dumps({"urlBindings": [metadata]})},
        timeout=30,
    )
    assert updated.status_code == 400
    assert updated.json()["reason"] == (
        "urlBindings[0] (api, http://169.254.169.254/latest/meta-data): host 169.254.169.254 is "
        "a link-local (cloud metadata) address, which the worker's url_binding_hosts (public, "
        "127.0.0.1) does not allow; the worker's operator decides where URL bindings may point"
    )
