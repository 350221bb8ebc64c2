"""URL bindings without a broker: the config's rules, where a request may go, and ``curl``
through the executor's seam against a local HTTP endpoint (each request sent once, however
often its message runs)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from magnetar.instance.exceptions import FunctionLoadError
from magnetar.instance.javascript import open_executor
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.secrets import EnvironmentSecretsProvider
from magnetar.instance.state import UnconfiguredStateStore
from magnetar.instance.url_bindings import UrlOutsideBindingError, request_url, under_binding
from magnetar.instance.url_hosts import UrlHostRule
from tests.http_endpoint import Server, http_endpoint
from tests.unit.test_javascript import MemoryState, config_error, executor, outputs, parse


@pytest.fixture
def server() -> Iterator[Server]:
    with http_endpoint() as endpoint:
        yield endpoint


# --- the config ---------------------------------------------------------------------------

API = {"alias": "api", "url": "https://api.example.com/v1"}
THE_TEST_SERVER = UrlHostRule(("public", "127.0.0.1"))
"""The worker's setting that lets bindings reach the test's server (on 127.0.0.1)."""


def test_bindings_parse_with_their_defaults() -> None:
    config = parse(
        js="fn.js",
        secrets={"token": "t"},
        urlBindings=[{**API, "auth": {"type": "bearer", "secret": "token"}, "timeoutMs": 500}],
    )
    [binding] = config.url_bindings
    assert (binding.alias, binding.timeout_ms, binding.max_response_bytes) == (
        "api",
        500,
        16 * 1024 * 1024,
    )
    assert binding.auth.secret == "token"
    assert '"urlBindings":[{"alias":"api"' in config.to_json()


@pytest.mark.parametrize(
    ("bindings", "secrets", "message"),
    [
        (
            [{"alias": "api", "url": "ftp://files.example.com/"}],
            {},
            "urlBindings[0].url 'ftp://files.example.com/' must be an http:// or https:// URL "
            "with a host",
        ),
        (
            [{"alias": "api", "url": "https:///path"}],
            {},
            "must be an http:// or https:// URL with a host",
        ),
        (
            [{"alias": "api", "url": "https://u:p@api.example.com/"}],
            {},
            "urlBindings[0].url must not hold credentials (user:password@): put them in one of "
            "the function's secrets and name it in auth",
        ),
        (
            [{"alias": "api", "url": "https://api.example.com/?key=1"}],
            {},
            "must be a base URL without query, fragment, spaces or backslashes",
        ),
        (
            [{"alias": "api", "url": "https://api.example.com:port/"}],
            {},
            "urlBindings[0].url 'https://api.example.com:port/' is not a valid URL",
        ),
        (
            [{**API, "auth": {"type": "digest", "secret": "s"}}],
            {"s": "x"},
            "urlBindings[0].auth.type 'digest' is not supported (supported: none, basic, bearer)",
        ),
        (
            [{**API, "auth": {"type": "bearer"}}],
            {},
            "urlBindings[0].auth: bearer authentication needs secret, the name of one of the "
            "function's secrets (the password or token is never written in the binding)",
        ),
        (
            [{**API, "auth": {"type": "basic", "secret": "s"}}],
            {"s": "x"},
            "urlBindings[0].auth: basic authentication needs a username",
        ),
        (
            [{**API, "auth": {"type": "bearer", "secret": "tok"}}],
            {"other": "x"},
            "urlBindings[0].auth.secret 'tok' is not one of the function's secrets (declared: "
            "other); add it to secrets",
        ),
        (
            [{**API, "auth": {"type": "none", "secret": "s"}}],
            {"s": "x"},
            "urlBindings[0].auth: type none takes no username or secret",
        ),
        ([API, {**API, "url": "http://b/"}], {}, "urlBindings[1].alias 'api' is declared twice"),
        (
            [{**API, "alias": "my-api"}],
            {},
            "urlBindings[0].alias 'my-api' must be a JavaScript identifier",
        ),
        ([{**API, "timeoutMs": 0}], {}, "urlBindings.0.timeoutMs: Input should be greater than 0"),
        ([{**API, "password": "x"}], {}, "urlBindings.0.password: unknown field"),
    ],
)
def test_invalid_bindings_say_what_is_wrong(
    bindings: list[dict[str, Any]], secrets: dict[str, str], message: str
) -> None:
    assert message in config_error(js="fn.js", secrets=secrets, urlBindings=bindings)


def test_python_functions_have_no_bindings() -> None:
    assert "urlBindings are for JavaScript functions (curl())" in config_error(
        py="fn.py", urlBindings=[API]
    )


def test_the_cli_flag_takes_the_bindings_as_json() -> None:
    from magnetar.cli.function_flags import config_from_flags

    config = config_from_flags(
        None, name="fn", js="fn.js", inputs="in", url_bindings=json.dumps([API])
    )
    assert [b.url for b in config.url_bindings] == ["https://api.example.com/v1"]


# --- where a request goes -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "path", "params", "url"),
    [
        ("http://h/v1", "items/7", None, "http://h/v1/items/7"),
        ("http://h/v1/", "/items/7", None, "http://h/v1/items/7"),
        ("http://h/v1", "", None, "http://h/v1"),
        ("http://h/v1/", "", None, "http://h/v1/"),
        ("http://h", "", None, "http://h/"),
        ("http://h:81/v1", "a/./b/../c/", None, "http://h:81/v1/a/c/"),
        ("http://h/v1", "find?x=1", {"q": "a b", "n": [1, 2], "ok": True},
         "http://h/v1/find?x=1&q=a+b&n=1&n=2&ok=true"),
        ("http://h/v1", "dé jà", None, "http://h/v1/d%C3%A9%20j%C3%A0"),
    ],
)  # fmt: skip
def test_request_urls_stay_under_the_base(
    base: str, path: str, params: dict[str, Any] | None, url: str
) -> None:
    assert request_url(base, path, params) == url


@pytest.mark.parametrize(
    "path",
    [
        "../v2/items",
        "a/../../v2",
        "../../../etc/passwd",
        "%2e%2e/v2",
        "a%2f..%2f..%2fv2",
        "http://other/v1",
        "//other/v1",
        "a\\..\\..\\v2",
        "x\r\nHost: evil",
        "a#frag",
    ],
)
def test_escapes_are_refused(path: str) -> None:
    with pytest.raises(UrlOutsideBindingError):
        request_url("http://h/v1", path)


def test_a_base_path_is_a_whole_segment() -> None:
    assert not under_binding("http://h/v1", "http://h/v1evil")
    assert under_binding("http://h/v1", "http://h/v1/a")
    assert not under_binding("http://h/v1", "https://h/v1/a")  # another scheme
    assert not under_binding("http://h/v1", "http://h:8080/v1/a")  # another port
    assert not under_binding("http://h/v1", "http://g/v1/a")


# --- curl through the executor ------------------------------------------------------------


def test_each_request_goes_out_once_while_state_reads_rerun_the_message(
    tmp_path: Path, server: Server
) -> None:
    state = MemoryState()
    run = executor(
        tmp_path,
        """
        let runs = 0;
        function process(input, context) {
          runs++;
          const first = curl('POST', api, {path: 'log', body: input});
          const count = context.getCounter(input);
          const second = curl('GET', api, {path: 'n/' + count});
          context.incrCounter(input, 1);
          return first.body.body + ' ' + second.body.path + ' runs=' + runs;
        }
        """,
        state,
        url_hosts=THE_TEST_SERVER,
        urlBindings=[{"alias": "api", "url": f"{server.base}/api"}],
    )
    assert outputs(run, ["a", "a", "b"]) == [
        "a /api/n/0 runs=4",  # a request, a read, a request: three more runs
        "a /api/n/1 runs=7",  # the key is known now: two requests, two more runs
        "b /api/n/0 runs=11",
    ]
    sent = ["/api/log", "/api/n/0", "/api/log", "/api/n/1", "/api/log", "/api/n/0"]
    assert server.seen.paths() == sent
    # a new batch starts afresh: the answers of the last one's first message are gone
    assert outputs(run, ["c"]) == ["c /api/n/0 runs=15"]
    assert len(server.seen.paths()) == 8
    run.close()


def test_curl_outside_bindings_and_outside_messages(tmp_path: Path, server: Server) -> None:
    run = executor(
        tmp_path,
        """
        function process(input) {
          try { curl('GET', 'api', {}); } catch (e) { return e.name + ': ' + e.message; }
        }
        """,
    )
    assert outputs(run, ["x"]) == [
        "CurlError: curl: 'api' is no URL binding of this function (bindings: none)"
    ]
    run.close()
    with pytest.raises(FunctionLoadError) as caught:
        executor(tmp_path, "curl('GET', 'api', {});\nfunction process(i) { return i; }")
    assert "threw: Error: curl can only be called while processing a message" in str(caught.value)
    path = tmp_path / "fn.js"
    path.write_text("function process(i) { return i; }")
    config = parse(
        js=str(path),
        secrets={"API_TOKEN_FOR_TEST": "unused"},  # the environment provider reads the env
        urlBindings=[{**API, "auth": {"type": "bearer", "secret": "API_TOKEN_FOR_TEST"}}],
    )
    with pytest.raises(FunctionLoadError) as caught:
        open_executor(
            config,
            0,
            UnconfiguredStateStore(config.fqfn),
            InstanceMetrics(0),
            logging.getLogger("test.js"),
            EnvironmentSecretsProvider(),
            False,
        )
    assert str(caught.value) == (
        "URL binding 'api': secret 'API_TOKEN_FOR_TEST' has no value (its secrets provider "
        "returned none)"
    )


def test_request_mistakes_are_type_errors(tmp_path: Path, server: Server) -> None:
    run = executor(
        tmp_path,
        """
        function attempt(call) {
          try { call(); return 'ok'; } catch (e) { return e.name + ': ' + e.message; }
        }
        function process(input) {
          return [
            attempt(() => curl('FETCH', api, {})),
            attempt(() => curl('GET', api, {url: 'x'})),
            attempt(() => curl('GET', api, {headers: {n: 1}})),
            attempt(() => curl('GET', api, {headers: {Host: 'evil'}})),
            attempt(() => curl('GET', api, {headers: {'X-A': 'a\\r\\nHost: evil'}})),
          ].join('|');
        }
        """,
        url_hosts=THE_TEST_SERVER,
        urlBindings=[{"alias": "api", "url": f"{server.base}/api"}],
    )
    assert outputs(run, ["x"])[0] == "|".join(
        [
            "TypeError: curl: method must be one of GET, POST, PUT, HEAD, DELETE, PATCH, got "
            '"FETCH"',
            "TypeError: curl: request has no field url (fields: path, params, headers, body, "
            "redirect)",
            "TypeError: curl: header n must be a string",
            "CurlError: curl GET api /: header Host is set by Magnetar, not by the script",
            "CurlError: curl GET api /: invalid request: Invalid header value b'a\\r\\nHost: evil'",
        ]
    )
    assert server.seen.paths() == []
    run.close()
