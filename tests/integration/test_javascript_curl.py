"""``curl()`` from JavaScript functions to their URL bindings, against a local HTTP server
started by the test: what the function returns, what the server saw, what the status says."""

from __future__ import annotations

import json
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from magnetar.instance import FunctionInstance, InstanceOptions
from magnetar.instance.url_hosts import UrlHostRule
from tests.http_endpoint import Server, http_endpoint
from tests.integration.conftest import RunFunction, collect, produce, values, wait_for

WITH_THE_SERVER = InstanceOptions(
    retry_delay_ms=200, url_hosts=UrlHostRule(("public", "127.0.0.1"))
)
"""The worker's url_binding_hosts that lets bindings reach the test's server (127.0.0.1)."""
NOT_RELATIVE = (
    "must be relative to the binding's URL (no absolute URL, control character, backslash or "
    "fragment)"
)


@pytest.fixture
def server() -> Iterator[Server]:
    with http_endpoint() as endpoint:
        yield endpoint


def write_script(tmp_path: Path, source: str) -> str:
    path = tmp_path / f"fn_{uuid.uuid4().hex[:6]}.js"
    path.write_text(textwrap.dedent(source))
    return str(path)


def status(instance: FunctionInstance) -> dict[str, Any]:
    result: dict[str, Any] = instance.snapshot().status()["status"]
    return result


def test_get_and_post_json_with_params_headers_and_auth_from_secrets(
    client: pulsar.Client, run_function: RunFunction, topic: str, server: Server, tmp_path: Path
) -> None:
    path = write_script(
        tmp_path,
        """
        function process(input, context) {
          const got = curl('GET', api, {path: '/items/' + input,
                                        params: {q: 'a b', n: 2}, headers: {'X-Trace': 't1'}});
          const posted = curl('POST', 'api', {path: 'orders', body: {item: input, count: 3}});
          const text = curl('GET', basicApi, {path: 'text'});
          const missing = curl('GET', api, {path: 'missing'});
          context.log('called ' + input);
          return {got: got.body, gotStatus: got.status, gotType: got.headers['content-type'],
                  posted: posted.body, text: text.body, basic: text.status,
                  missing: [missing.status, missing.body]};
        }
        """,
    )
    run_function(
        options=WITH_THE_SERVER,
        js=path,
        inputs=[topic],
        output=f"{topic}-out",
        output_serde_class_name="json",
        secrets={"apiToken": "t0ken", "apiPassword": "pa55"},
        url_bindings=[
            {
                "alias": "api",
                "url": f"{server.base}/api",
                "auth": {"type": "bearer", "secret": "apiToken"},
            },
            {
                "alias": "basicApi",
                "url": f"{server.base}/api/",
                "auth": {"type": "basic", "username": "ann", "secret": "apiPassword"},
            },
        ],
    )
    produce(client, topic, ["w1", "w2"])
    out = [json.loads(m.data()) for m in collect(client, f"{topic}-out", 2)]
    first = out[0]
    assert first["gotStatus"] == 200
    assert first["gotType"] == "application/json"
    assert first["got"] == {
        "method": "GET",
        "path": "/api/items/w1",
        "query": {"q": ["a b"], "n": ["2"]},
        "authorization": "Bearer t0ken",
        "trace": "t1",
        "host": server.base.removeprefix("http://"),
        "contentType": None,
        "body": "",
    }
    assert first["posted"]["method"] == "POST"
    assert first["posted"]["path"] == "/api/orders"
    assert first["posted"]["contentType"] == "application/json"
    assert json.loads(first["posted"]["body"]) == {"item": "w1", "count": 3}
    assert first["text"] == "plain words"  # not JSON: the text
    assert first["missing"] == [404, {"error": "no such thing"}]  # a status, not an error
    assert out[1]["got"]["path"] == "/api/items/w2"
    # four requests a message, each sent once though the message ran five times
    per_message = ["items/{}", "orders", "text", "missing"]
    assert server.seen.paths() == [
        "/api/" + path.format(word) for word in ("w1", "w2") for path in per_message
    ]
    basic = server.seen.requests[2]["authorization"]
    assert basic == "Basic YW5uOnBhNTU="  # ann:pa55


def test_only_the_bindings_are_reachable_and_errors_name_their_cause(
    client: pulsar.Client, run_function: RunFunction, topic: str, server: Server, tmp_path: Path
) -> None:
    path = write_script(
        tmp_path,
        """
        function attempt(call) {
          try { return 'ok ' + call().status; } catch (e) { return e.name + ': ' + e.message; }
        }
        function process(input) {
          const base = 'BASE';
          return [
            attempt(() => curl('GET', api, {path: '../private/data'})),
            attempt(() => curl('GET', api, {path: '%2e%2e/private/data'})),
            attempt(() => curl('GET', api, {path: base + '/private/data'})),
            attempt(() => curl('GET', api, {path: '//evil.example/x'})),
            attempt(() => curl('GET', api, {path: 'away', redirect: true})),
            attempt(() => curl('GET', 'nope', {})),
            attempt(() => curl('GET', api, {path: 'big'})),
            attempt(() => curl('GET', api, {path: 'unsized'})),
            attempt(() => curl('GET', api, {path: 'sub/../text'})),
          ];
        }
        """.replace("BASE", server.base),
    )
    run_function(
        options=WITH_THE_SERVER,
        js=path,
        inputs=[topic],
        output=f"{topic}-out",
        output_serde_class_name="json",
        url_bindings=[{"alias": "api", "url": f"{server.base}/api", "maxResponseBytes": 1024}],
    )
    produce(client, topic, ["go"])
    answers = json.loads(collect(client, f"{topic}-out", 1)[0].data())
    assert answers == [
        "CurlError: curl GET api ../private/data: path '../private/data' leaves the "
        f"binding's URL {server.base}/api",
        "CurlError: curl GET api %2e%2e/private/data: path '%2e%2e/private/data' hides a dot "
        "segment or a slash in percent-encoding",
        f"CurlError: curl GET api {server.base}/private/data: path "
        f"'{server.base}/private/data' {NOT_RELATIVE}",
        f"CurlError: curl GET api //evil.example/x: path '//evil.example/x' {NOT_RELATIVE}",
        f"CurlError: curl GET api away: the redirect to {server.base}/private/data leaves the "
        f"binding's URL {server.base}/api",
        "CurlError: curl: 'nope' is no URL binding of this function (bindings: api)",
        "CurlError: curl GET api big: the response is too large: 4096 bytes, over the "
        "binding's limit of 1024 bytes (maxResponseBytes)",
        "CurlError: curl GET api unsized: the response is too large: more than 1024 bytes, over "
        "the binding's limit of 1024 bytes (maxResponseBytes)",
        "ok 200",
    ]
    assert server.seen.paths() == ["/api/away", "/api/big", "/api/unsized", "/api/text"]


def test_a_timeout_fails_the_message_which_is_retried_then_dead_lettered(
    client: pulsar.Client, run_function: RunFunction, topic: str, server: Server, tmp_path: Path
) -> None:
    path = write_script(
        tmp_path,
        """
        function process(input) {
          return curl('GET', api, {path: input}).body;
        }
        """,
    )
    instance = run_function(
        options=WITH_THE_SERVER,
        js=path,
        inputs=[topic],
        output=f"{topic}-out",
        max_message_retries=1,
        dead_letter_topic=f"{topic}-dlq",
        url_bindings=[{"alias": "api", "url": f"{server.base}/api/", "timeoutMs": 300}],
    )
    produce(client, topic, ["text", "slow", "text"])
    assert values(collect(client, f"{topic}-out", 2)) == ["plain words", "plain words"]
    assert values(collect(client, f"{topic}-dlq", 1, timeout=20)) == ["slow"]
    wait_for(lambda: instance.metrics.user_exceptions == 2)  # the first try and one retry
    error = status(instance)["latestUserExceptions"][0]["exceptionString"]
    assert error.startswith("CurlError: curl GET api slow: timed out after 300 ms\n    at process")
    assert server.seen.paths().count("/api/slow") == 2
