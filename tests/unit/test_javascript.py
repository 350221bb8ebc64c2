"""JavaScript functions without a broker: the FunctionConfig rules, script loading errors, and
the executor's seam (a batch in one call into V8, state reads and writes through a
``StateStore``). Messages are stand-ins with the accessors the executor reads."""

from __future__ import annotations

import logging
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from magnetar.instance.config import FunctionConfig
from magnetar.instance.exceptions import FunctionLoadError, InvalidFunctionConfigError
from magnetar.instance.javascript import ScriptExecutor, check_script, open_executor
from magnetar.instance.metrics import InstanceMetrics
from magnetar.instance.secrets import ClearTextSecretsProvider
from magnetar.instance.state import StateStore, UnconfiguredStateStore
from magnetar.instance.url_hosts import PUBLIC_HOSTS, UrlHostRule
from tests.conftest import EXAMPLES

# --- FunctionConfig -----------------------------------------------------------------------


def parse(**fields: Any) -> FunctionConfig:
    return FunctionConfig.parse({"name": "fn", "inputs": ["in"], **fields})


def config_error(**fields: Any) -> str:
    with pytest.raises(InvalidFunctionConfigError) as caught:
        parse(**fields)
    return str(caught.value)


def test_a_script_makes_the_runtime_javascript() -> None:
    config = parse(js="fn.js")
    assert config.is_javascript and config.code_path == "fn.js"
    assert parse(js="fn.js", runtime="javascript").runtime == "JAVASCRIPT"
    assert parse(py="fn.py").code_path == "fn.py" and not parse(py="fn.py").is_javascript
    assert '"runtime":"JAVASCRIPT","js":"fn.js"' in config.to_json()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"runtime": "GO"}, "runtime 'GO' is not supported (supported: PYTHON, JAVASCRIPT)"),
        ({"js": "fn.js", "runtime": "PYTHON"}, "js is set but runtime is PYTHON"),
        ({"py": "fn.py", "runtime": "JAVASCRIPT"}, "py is set but runtime is JAVASCRIPT"),
        ({"py": "fn.py", "js": "fn.js"}, "set py (--py) or js (--js), not both"),
        (
            {"js": "fn.js", "outputSerdeClassName": "serde.JsonSerDe"},
            "outputSerdeClassName is 'serde.JsonSerDe', but a JavaScript function reads and "
            "writes 'string' (the default) or 'json'",
        ),
        (
            {"js": "fn.js", "customSerdeInputs": {"in": "pickle"}},
            "customSerdeInputs[in] is 'pickle'",
        ),
        ({"js": "fn.js", "resources": {"ram": "lots"}}, "resources.ram must be a positive"),
    ],
)
def test_runtime_and_code_must_match(fields: dict[str, Any], message: str) -> None:
    assert message in config_error(**fields)


# --- loading ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "function process(input) {\n  return input +;\n}\n",
            "syntax error in fn.js, line 2, column 17: SyntaxError: Unexpected token ';'\n"
            "      return input +;",
        ),
        (
            "function process(input) {\n  return input;\n",
            "syntax error in fn.js, line 3, column 1: SyntaxError: Unexpected end of input",
        ),
        (
            "'use strict';\nwith (Math) { x = 1; }\nfunction process(i) { return i; }",
            "syntax error in fn.js, line 2, column 1: SyntaxError: Strict mode code may not "
            "include a with statement",
        ),
    ],
)
def test_syntax_error_names_line_and_column(source: str, expected: str) -> None:
    with pytest.raises(FunctionLoadError) as caught:
        check_script(source, "fn.js")
    assert str(caught.value).startswith(expected)


@pytest.mark.parametrize(
    ("source", "name", "expected"),
    [
        (
            "function helper() {}\nconst x = 1;\n",
            None,
            "fn.js defines no function 'process'; it defines: helper",
        ),
        ("function process(i) { return i; }", "transform", "defines no function 'transform'"),
        ("function process(i) { return i; }", "process()", "must name a function of the script"),
        (
            "function f() { throw new TypeError('no config'); }\nf();\n",
            None,
            "the top-level code of fn.js threw: TypeError: no config\n    at f (fn.js:1:22)",
        ),
        ("while (true) {}", None, "the top-level code of fn.js ran longer than 200 ms"),
        (b"function process() {} // \xff", None, "function script fn.js is not UTF-8 text"),
    ],
)
def test_load_errors_say_what_is_wrong(
    source: str | bytes, name: str | None, expected: str
) -> None:
    with pytest.raises(FunctionLoadError) as caught:
        check_script(source, "fn.js", name, timeout_ms=200)
    assert expected in str(caught.value)


EXAMPLE_SCRIPTS = {
    "exclamation.js": None,
    "fragile.js": None,
    "json_transform.js": None,
    "publish.js": None,
    "reminders.js": None,
    "user_config.js": "greet",
    "word_count.js": None,
}


@pytest.mark.parametrize(("example", "function"), EXAMPLE_SCRIPTS.items())
def test_every_example_script_loads(example: str, function: str | None) -> None:
    check_script((EXAMPLES / example).read_text(), example, function)


def test_every_example_script_is_covered() -> None:
    assert {p.name for p in EXAMPLES.glob("*.js")} == set(EXAMPLE_SCRIPTS)


def test_a_named_function_and_an_object_method_load() -> None:
    check_script("const handlers = { run: (input) => input };", "fn.js", "handlers.run")
    check_script("let transform = (input) => input;", "fn.js", "transform")


# --- the executor seam --------------------------------------------------------------------


@dataclass
class Message:
    """The accessors of ``pulsar.Message`` that the executor reads."""

    value: bytes
    position: int
    topic: str = "persistent://public/default/in"
    key: str = ""
    props: dict[str, str] = field(default_factory=dict)

    def topic_name(self) -> str:
        return self.topic

    def data(self) -> bytes:
        return self.value

    def message_id(self) -> str:
        return f"(1,{self.position},-1,-1)"

    def partition_key(self) -> str:
        return self.key

    def event_timestamp(self) -> int:
        return 0

    def properties(self) -> dict[str, str]:
        return dict(self.props)


class MemoryState:
    """A StateStore in memory that counts its reads (only for this seam's unit tests)."""

    def __init__(self) -> None:
        self.counters: dict[str, int] = {}
        self.values: dict[str, bytes] = {}
        self.reads: list[str] = []

    def incr(self, key: str, amount: int) -> None:
        self.counters[key] = self.counters.get(key, 0) + amount

    def get_counter(self, key: str) -> int:
        self.reads.append(key)
        return self.counters.get(key, 0)

    def put(self, key: str, value: bytes) -> None:
        self.values[key] = value

    def get(self, key: str) -> bytes | None:
        self.reads.append(key)
        return self.values.get(key)

    def delete(self, key: str) -> None:
        self.counters.pop(key, None)
        self.values.pop(key, None)


def executor(
    tmp_path: Path,
    source: str,
    state: StateStore | None = None,
    stop_on_error: bool = False,
    url_hosts: UrlHostRule = PUBLIC_HOSTS,
    **fields: Any,
) -> ScriptExecutor:
    path = tmp_path / "fn.js"
    path.write_text(textwrap.dedent(source))
    config = parse(js=str(path), **fields)
    return open_executor(
        config,
        0,
        state or UnconfiguredStateStore(config.fqfn),
        InstanceMetrics(0),
        logging.getLogger("test.js"),
        ClearTextSecretsProvider(),
        stop_on_error,
        url_hosts,
    )


def outputs(run: ScriptExecutor, inputs: list[str]) -> list[str | None]:
    messages = [Message(value.encode(), i) for i, value in enumerate(inputs)]
    return [
        o.error if o.error is not None else (o.output or b"").decode()
        for o in run.process(messages)
    ]


def test_a_batch_crosses_into_v8_once(tmp_path: Path) -> None:
    run = executor(tmp_path, "function process(input) { return input + '!'; }")
    calls = run.call_id
    assert outputs(run, [f"m{i}" for i in range(500)]) == [f"m{i}!" for i in range(500)]
    assert run.call_id == calls + 1
    run.close()


def test_a_function_replacing_json_and_the_runtime_does_not_break_later_calls(
    tmp_path: Path,
) -> None:
    """Each call hands V8 its arguments as JSON that the runtime parses: with the parser it
    took when it loaded, not whatever the user's code left in ``JSON``."""
    run = executor(
        tmp_path,
        """
        function process(input) {
          if (input === 'vandal') {
            JSON.parse = () => [0, 0, [], [['forged', false]], null, false];
            JSON.stringify = () => '{}';
            try { __magnetar_runtime__.runPacked = null; } catch (e) {}
            return 'done';
          }
          return input + '!';
        }
        """,
    )
    assert outputs(run, ["a", "vandal"]) == ["a!", "done"]
    assert outputs(run, ["b", "c"]) == ["b!", "c!"]
    run.close()


def test_results_are_strings_as_utf8_and_values_as_json(tmp_path: Path) -> None:
    run = executor(
        tmp_path,
        """
        function process(input) {
          if (input === 'obj') return {a: [1, 'é']};
          if (input === 'num') return 42;
          if (input === 'none') return undefined;
          if (input === 'async') return Promise.resolve(1);
          return input.toUpperCase();
        }
        """,
    )
    messages = [Message(v.encode(), i) for i, v in enumerate(["é!", "obj", "num", "none"])]
    assert [o.output for o in run.process(messages)] == [
        "É!".encode(),
        '{"a":[1,"é"]}'.encode(),
        b"42",
        None,
    ]
    [failed] = run.process([Message(b"async", 9)])
    assert failed.error is not None
    assert "the returned value is a Promise: async functions are not supported" in failed.error
    run.close()


def test_reads_see_the_writes_of_the_messages_before_them(tmp_path: Path) -> None:
    state = MemoryState()
    state.counters["seen"] = 10
    run = executor(
        tmp_path,
        """
        let runs = 0;
        function process(input, context) {
          runs++;
          context.incrCounter('seen', 1);
          context.incrCounter(input, 1);
          return input + ' ' + context.getCounter('seen') + ' ' + context.getCounter(input)
            + ' runs=' + runs;
        }
        """,
        state,
    )
    assert outputs(run, ["a", "b", "a", "a"]) == [
        "a 11 1 runs=3",  # two new keys: two reads, two more runs
        "b 12 1 runs=5",
        "a 13 2 runs=6",  # known now: one run
        "a 14 3 runs=7",
    ]
    assert state.reads == ["seen", "a", "b"]
    assert state.counters == {"seen": 14, "a": 3, "b": 1}
    # a new batch reads again: another instance may have written meanwhile
    state.counters["seen"] = 100
    assert outputs(run, ["b"]) == ["b 101 2 runs=10"]
    run.close()


def test_a_failed_message_leaves_no_state_and_the_rest_goes_on(tmp_path: Path) -> None:
    state = MemoryState()
    run = executor(
        tmp_path,
        """
        function process(input, context) {
          context.incrCounter('total', 1);
          if (input === 'boom') throw new RangeError('bad input');
          context.putState('last', input);
          return context.getState('last') + '/' + context.getCounter('total');
        }
        """,
        state,
    )
    results = outputs(run, ["a", "boom", "b"])
    assert results[0] == "a/1"
    assert results[1] is not None and results[1].startswith("RangeError: bad input\n    at ")
    assert results[2] == "b/2"
    assert state.counters == {"total": 2} and state.values == {"last": b"b"}
    run.close()


def test_stop_on_error_ends_the_batch_at_the_failure(tmp_path: Path) -> None:
    run = executor(
        tmp_path,
        "function process(i) { if (i === 'x') throw new Error('x'); return i; }",
        stop_on_error=True,
    )
    assert [
        o.error is None
        for o in run.process([Message(v, n) for n, v in enumerate([b"a", b"x", b"c"])])
    ] == [True, False]
    run.close()


def test_a_state_update_the_store_refuses_fails_its_message_only(tmp_path: Path) -> None:
    class Refusing(MemoryState):
        def put(self, key: str, value: bytes) -> None:
            if len(value) > 3:
                raise ValueError(f"value of {key!r} too large")
            super().put(key, value)

    state = Refusing()
    run = executor(
        tmp_path,
        """
        function process(input, context) {
          context.putState('k', input);
          return context.getState('k');
        }
        """,
        state,
    )
    results = outputs(run, ["ab", "abcdef", "cd"])
    assert results[0] == "ab"
    assert results[1] == "updating state key 'k' failed: ValueError: value of 'k' too large"
    assert results[2] == "cd"
    run.close()


def test_effects_and_context_values(tmp_path: Path) -> None:
    run = executor(
        tmp_path,
        """
        function process(input, context) {
          context.publish('side', {n: input.length}, {origin: context.getMessageKey()});
          context.publish('side', input);
          context.recordMetric('length', input.length);
          if (input === 'ack') context.ack();
          return [context.getSecret('pw'), context.getUserConfigValue('missing'),
                  context.getInputTopics(), context.getOutputTopic()];
        }
        """,
        secrets={"pw": "hunter2"},
        output="out",
    )
    [outcome] = run.process([Message(b"ack", 0, key="k")])
    assert outcome.publishes == [("side", b'{"n":3}', {"origin": "k"}), ("side", b"ack", None)]
    assert outcome.ack
    assert outcome.output == b'["hunter2",null,["persistent://public/default/in"],"out"]'
    assert run.metrics.user_metric_sums == {"length": 3.0}
    [keyless] = run.process([Message(b"x", 1)])
    # no key is '' as in Apache's Python runtime, not null
    assert keyless.publishes[0] == ("side", b'{"n":1}', {"origin": ""})
    run.close()


def test_context_misuse_is_a_type_error_in_the_function(tmp_path: Path) -> None:
    run = executor(
        tmp_path,
        """
        function process(input, context) {
          if (input === 'amount') context.incrCounter('k', 1.5);
          if (input === 'props') context.publish('t', 'v', {n: 1});
          if (input === 'metric') context.recordMetric('m', 'high');
          return input;
        }
        """,
        MemoryState(),
    )
    errors = outputs(run, ["amount", "props", "metric"])
    assert errors[0] is not None and errors[0].startswith(
        "TypeError: incrCounter(k, amount) needs an integer amount"
    )
    assert errors[1] is not None and errors[1].startswith(
        "TypeError: publish properties must be strings; n is 1"
    )
    assert errors[2] is not None and errors[2].startswith(
        "TypeError: recordMetric(name, value) needs a string and a finite number"
    )
    run.close()


def test_metadata_is_sent_once_the_function_asks_for_it(tmp_path: Path) -> None:
    # the getter's name is not in the source, so the batch goes without metadata first
    run = executor(
        tmp_path,
        """
        let runs = 0;
        const getter = 'get' + 'MessageKey';
        function process(input, context) {
          runs++;
          return input + ':' + context[getter]() + ':' + runs;
        }
        """,
    )
    assert not run.with_metadata
    messages = [Message(b"a", 0, key="k0"), Message(b"b", 1)]
    # no key is "", as in Apache's Python runtime
    assert [o.output for o in run.process(messages)] == [b"a:k0:2", b"b::3"]
    assert run.with_metadata  # from now on, with every batch
    assert [o.output for o in run.process([Message(b"c", 2, key="k2")])] == [b"c:k2:4"]
    run.close()
