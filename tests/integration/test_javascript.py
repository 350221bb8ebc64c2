"""JavaScript functions on V8 in a real instance against the session broker: what a user sees
on the output topics and in the instance's status."""

from __future__ import annotations

import json
import signal
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from magnetar.instance import FunctionConfig, FunctionInstance, FunctionLoadError, InstanceOptions
from magnetar.statestore import JournaledStateStore, StateOptions
from tests.conftest import EXAMPLES
from tests.http_endpoint import http_endpoint
from tests.integration.conftest import RunFunction, collect, produce, values, wait_for
from tests.integration.test_localrun_cli import LocalRunProcess, run_cli

Script = Callable[[str], str]


@pytest.fixture
def script(tmp_path: Path) -> Script:
    """Write a .js file into ``tmp_path``; returns its path."""

    def write(source: str) -> str:
        path = tmp_path / f"fn_{uuid.uuid4().hex[:6]}.js"
        path.write_text(textwrap.dedent(source))
        return str(path)

    return write


def example(name: str) -> str:
    return str(EXAMPLES / name)


def status(instance: FunctionInstance) -> dict[str, Any]:
    result: dict[str, Any] = instance.snapshot().status()["status"]
    return result


def test_exclamation_keeps_order_and_properties(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    produce(client, topic, [f"m{i}" for i in range(300)], partition_key="k", properties={"p": "1"})
    instance = run_function(js=example("exclamation.js"), inputs=[topic], output=f"{topic}-out")
    out = collect(client, f"{topic}-out", 300)
    assert values(out) == [f"m{i}!" for i in range(300)]
    assert out[0].partition_key() == ""  # as Python results: sent without the input's key
    assert out[0].properties()["p"] == "1"
    assert out[0].properties()["__pfn_input_topic__"] == f"persistent://public/default/{topic}"
    wait_for(lambda: status(instance)["numSuccessfullyProcessed"] == 300)
    assert status(instance)["numReceived"] == 300
    assert status(instance)["numUserExceptions"] == 0


def test_json_transform_and_undecodable_input(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    name = f"doubler-{uuid.uuid4().hex[:6]}"
    instance = run_function(
        js=example("json_transform.js"),
        name=name,
        custom_serde_inputs={topic: "json"},
        output=f"{topic}-out",
        output_serde_class_name="json",
        max_message_retries=1,
        dead_letter_topic=f"{topic}-dlq",
    )
    produce(client, topic, [json.dumps({"id": 1, "amount": 2}), "not json", '{"amount": 5}'])
    out = [json.loads(m.data()) for m in collect(client, f"{topic}-out", 2)]
    assert sorted(out, key=lambda o: o["amount"]) == [
        {"id": 1, "amount": 4, "doubledBy": name},
        {"amount": 10, "doubledBy": name},
    ]
    assert values(collect(client, f"{topic}-dlq", 1, timeout=20)) == ["not json"]
    wait_for(lambda: instance.metrics.system_exceptions >= 1)
    latest = status(instance)["latestSystemExceptions"][0]["exceptionString"]
    assert latest.startswith("cannot deserialize message (")
    assert f"from persistent://public/default/{topic}: the payload is not JSON: " in latest


def test_publish_to_a_side_topic_with_properties_and_metrics(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    instance = run_function(
        js=example("publish.js"),
        name="publisher",
        inputs=[topic],
        user_config={"publish-topic": f"{topic}-side"},
    )
    produce(client, topic, ["a", "b", "c"])
    side = collect(client, f"{topic}-side", 3)
    assert values(side) == ["a!", "b!", "c!"]
    assert side[0].properties()["source"] == "publisher"
    wait_for(lambda: instance.snapshot().user_metrics.get("published") == (3.0, 3))


def test_user_config_and_classname(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    run_function(
        js=example("user_config.js"),
        class_name="greet",
        inputs=[topic],
        output=f"{topic}-out",
        user_config={"greeting": "Ahoy", "times": 2},
    )
    produce(client, topic, ["sailor"])
    assert values(collect(client, f"{topic}-out", 1)) == ["Ahoy, sailor Ahoy, sailor"]


def test_context_reports_the_message_and_the_function(
    client: pulsar.Client,
    run_function: RunFunction,
    topic: str,
    script: Script,
) -> None:
    path = script(
        """
        function process(input, context) {
          return {
            input: input,
            id: context.getMessageId(),
            key: context.getMessageKey(),
            eventTime: context.getMessageEventTime(),
            properties: context.getMessageProperties(),
            topic: context.getCurrentMessageTopicName(),
            fn: [context.getFunctionTenant(), context.getFunctionNamespace(),
                 context.getFunctionName(), context.getInstanceId()],
            config: context.getUserConfigMap(),
            secret: context.getSecret('MAGNETAR_JS_SECRET'),
            missing: context.getSecret('other'),
          };
        }
        """
    )
    run_function(
        js=path,
        name="introspect",
        inputs=[topic],
        output=f"{topic}-out",
        user_config={"nested": {"a": [1, 2]}},
        secrets={"MAGNETAR_JS_SECRET": "s3cret"},  # Apache's default provider: the value
    )
    producer = client.create_producer(topic)
    sent = producer.send(b"hi", partition_key="k1", event_timestamp=1234, properties={"x": "y"})
    producer.close()
    seen = json.loads(collect(client, f"{topic}-out", 1)[0].data())
    assert seen == {
        "input": "hi",
        "id": str(sent),
        "key": "k1",
        "eventTime": 1234,
        "properties": {"x": "y"},
        "topic": f"persistent://public/default/{topic}",
        "fn": ["public", "default", "introspect", 0],
        "config": {"nested": {"a": [1, 2]}},
        "secret": "s3cret",
        "missing": None,
    }


def test_thrown_error_is_a_user_exception_with_the_stack_and_others_go_on(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    produce(client, topic, ["a", "boom-1", "b"])  # one batch
    instance = run_function(
        js=example("fragile.js"),
        inputs=[topic],
        output=f"{topic}-out",
        max_message_retries=2,
        dead_letter_topic=f"{topic}-dlq",
    )
    assert values(collect(client, f"{topic}-out", 2)) == ["A", "B"]
    assert values(collect(client, f"{topic}-dlq", 1, timeout=20)) == ["boom-1"]
    wait_for(lambda: instance.metrics.user_exceptions == 3)  # first try + 2 retries
    error = status(instance)["latestUserExceptions"][0]["exceptionString"]
    assert error.startswith('Error: cannot handle "boom-1"\n    at process (')
    assert "fragile.js:5:" in error
    assert status(instance)["numSuccessfullyProcessed"] == 2


def test_runaway_loop_is_stopped_by_the_timeout_and_the_instance_goes_on(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    produce(client, topic, ["a", "hang", "b", "c"])  # one batch: the others still go through
    instance = run_function(
        js=example("fragile.js"),
        inputs=[topic],
        output=f"{topic}-out",
        timeout_ms=300,
        processing_guarantees="ATMOST_ONCE",
    )
    assert values(collect(client, f"{topic}-out", 3)) == ["A", "B", "C"]
    wait_for(lambda: instance.metrics.user_exceptions == 1)
    error = status(instance)["latestUserExceptions"][0]["exceptionString"]
    assert error == "the function ran longer than its timeout of 300 ms"
    produce(client, topic, ["after"])
    # the same subscription: only what came since (asking for 4 waited out the timeout)
    assert values(collect(client, f"{topic}-out", 1)) == ["AFTER"]


def test_time_limit_is_per_message_not_per_batch(
    client: pulsar.Client, run_function: RunFunction, topic: str, script: Script
) -> None:
    path = script(
        """
        function process(input) {
          const started = Date.now();
          while (Date.now() - started < 150) {}
          return input;
        }
        """
    )
    produce(client, topic, [f"s{i}" for i in range(6)])  # 900 ms in one batch
    instance = run_function(js=path, inputs=[topic], output=f"{topic}-out", timeout_ms=400)
    assert values(collect(client, f"{topic}-out", 6)) == [f"s{i}" for i in range(6)]
    assert instance.metrics.user_exceptions == 0


def test_ordered_subscription_redelivers_after_a_failure_in_order(
    client: pulsar.Client, run_function: RunFunction, topic: str, script: Script
) -> None:
    path = script(
        """
        let failed = false;
        function process(input) {
          if (input === 'flaky' && !failed) {
            failed = true;
            throw new Error('first try fails');
          }
          return input;
        }
        """
    )
    inputs = ["a", "b", "flaky", "c", "d"]
    produce(client, topic, inputs)
    instance = run_function(js=path, inputs=[topic], output=f"{topic}-out", retain_ordering=True)
    assert values(collect(client, f"{topic}-out", 5)) == inputs
    assert instance.metrics.user_exceptions == 1


def test_effectively_once_applies_each_input_once(
    client: pulsar.Client, run_function: RunFunction, topic: str, script: Script
) -> None:
    path = script(
        """
        const failed = new Set();
        function process(input) {
          if (input.endsWith('!') && !failed.has(input)) {
            failed.add(input);
            throw new Error('retry ' + input);
          }
          return input.toUpperCase();
        }
        """
    )
    inputs = ["a", "b!", "c", "d!", "e"]
    produce(client, topic, inputs)
    instance = run_function(
        js=path, inputs=[topic], output=f"{topic}-out", processing_guarantees="EFFECTIVELY_ONCE"
    )
    assert values(collect(client, f"{topic}-out", 5)) == [v.upper() for v in inputs]
    assert instance.metrics.user_exceptions == 2


def test_memory_limit_fails_the_message_not_the_instance(
    client: pulsar.Client, run_function: RunFunction, topic: str, script: Script
) -> None:
    path = script(
        """
        function process(input) {
          if (input === 'hog') {
            const hoard = [];
            while (true) hoard.push(new Array(100000).fill(input));
          }
          return input;
        }
        """
    )
    produce(client, topic, ["a", "hog", "b"])
    instance = run_function(
        js=path,
        inputs=[topic],
        output=f"{topic}-out",
        resources={"ram": 64 * 1024 * 1024},
        processing_guarantees="ATMOST_ONCE",
    )
    assert values(collect(client, f"{topic}-out", 2)) == ["a", "b"]
    wait_for(lambda: instance.metrics.user_exceptions == 1)
    error = status(instance)["latestUserExceptions"][0]["exceptionString"]
    assert error == "the function exceeded the JavaScript heap limit of 64 MiB"


def test_a_script_whose_globals_fill_its_heap_stops_out_of_memory(
    client: pulsar.Client, run_function: RunFunction, topic: str, script: Script
) -> None:
    path = script(
        """
        var keep = [];
        function process(input) {
          for (let i = 0; i < 20; i++) keep.push(new Array(100000).fill(input));
          return input;
        }
        """
    )
    produce(client, topic, [f"m{i}" for i in range(40)])
    instance = run_function(js=path, inputs=[topic], resources={"ram": 64 * 1024 * 1024})
    wait_for(lambda: instance.wait(0), timeout=30)
    error = status(instance)["error"]
    assert error.startswith("InstanceError: out of memory: the JavaScript heap of "), error
    assert "limit of 64 MiB (resources.ram): the script keeps too much in global variables" in (
        error
    )


def test_no_host_access(
    client: pulsar.Client, run_function: RunFunction, topic: str, script: Script
) -> None:
    path = script(
        """
        function process(input) {
          if (input === 'require') return require('fs').readFileSync('/etc/passwd');
          if (input === 'timer') return setTimeout(() => {}, 1);
          return [typeof require, typeof fetch, typeof XMLHttpRequest, typeof WebSocket,
                  typeof Deno, typeof module, typeof importScripts].join(',');
        }
        """
    )
    produce(client, topic, ["globals", "require", "timer"])
    instance = run_function(
        js=path, inputs=[topic], output=f"{topic}-out", processing_guarantees="ATMOST_ONCE"
    )
    assert values(collect(client, f"{topic}-out", 1)) == [",".join(["undefined"] * 7)]
    wait_for(lambda: instance.metrics.user_exceptions == 2)
    errors = [e["exceptionString"] for e in status(instance)["latestUserExceptions"]]
    assert errors[0].startswith("ReferenceError: require is not defined")
    assert errors[1].startswith("Error: setTimeout/setInterval are not available")


def test_state_without_a_store_says_it_is_not_configured(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    instance = run_function(
        js=example("word_count.js"), inputs=[topic], processing_guarantees="ATMOST_ONCE"
    )
    produce(client, topic, ["some words"])
    wait_for(lambda: instance.metrics.user_exceptions == 1)
    error = status(instance)["latestUserExceptions"][0]["exceptionString"]
    assert error.startswith(f"Error: state is not configured for function {instance.config.fqfn}")
    assert "at process (word_count.js:" in error


def test_manual_ack(
    client: pulsar.Client, run_function: RunFunction, topic: str, script: Script
) -> None:
    path = script(
        """
        function process(input, context) {
          if (input.startsWith('ack')) context.ack();
          return input;
        }
        """
    )
    fields: dict[str, Any] = {"name": "manual-js", "inputs": [topic]}
    first = run_function(js=path, output=f"{topic}-out", processing_guarantees="MANUAL", **fields)
    produce(client, topic, ["ack-1", "keep-2"])
    assert values(collect(client, f"{topic}-out", 2)) == ["ack-1", "keep-2"]
    first.stop()
    assert first.wait(10)
    second = run_function(js=path, output=f"{topic}-out2", processing_guarantees="MANUAL", **fields)
    assert values(collect(client, f"{topic}-out2", 1)) == ["keep-2"]
    assert second.metrics.received == 1


def test_logs_go_to_the_log_topic(
    client: pulsar.Client, run_function: RunFunction, topic: str
) -> None:
    run_function(js=example("fragile.js"), inputs=[topic], log_topic=f"{topic}-logs")
    produce(client, topic, ["fine"])
    logs = collect(client, f"{topic}-logs", 1)
    assert "handled fine" in values(logs)[0]
    assert logs[0].properties()["loglevel"] == "INFO"


def test_syntax_error_is_reported_on_start_with_line_and_column(
    client: pulsar.Client, topic: str, script: Script
) -> None:
    path = script("function process(input) {\n  return input +;\n}\n")
    config = FunctionConfig(name="broken", js=path, inputs=[topic])
    with pytest.raises(FunctionLoadError) as caught:
        FunctionInstance(config, client).start()
    assert str(caught.value).startswith(
        f"syntax error in {Path(path).name}, line 2, column 17: SyntaxError: Unexpected token ';'"
    )


@pytest.fixture
def run_stateful(client: pulsar.Client, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """An instance with the journaled state store (real broker, real RocksDB)."""
    started: list[tuple[FunctionInstance, JournaledStateStore]] = []

    def start(**fields: Any) -> FunctionInstance:
        fields.setdefault("name", f"js-state-{uuid.uuid4().hex[:8]}")
        fields.setdefault("subscription_position", "Earliest")
        config = FunctionConfig(**fields)
        state = JournaledStateStore(
            client, config.fqfn, StateOptions(str(tmp_path / f"state-{len(started)}"))
        )
        instance = FunctionInstance(
            config, client, InstanceOptions(retry_delay_ms=200), state=state
        )
        started.append((instance.start(), state))
        return instance

    yield start
    for instance, _ in started:
        instance.stop()
    for instance, state in started:
        assert instance.wait(30)
        state.close()


def test_word_count_with_counters(
    client: pulsar.Client, run_stateful: Callable[..., FunctionInstance], topic: str
) -> None:
    sentences = ["the quick fox", "the lazy dog", "a fox and the dog", "the end"]
    produce(client, topic, sentences)  # one batch: reads see the writes before them
    instance = run_stateful(js=example("word_count.js"), inputs=[topic], output=f"{topic}-out")
    assert values(collect(client, f"{topic}-out", 4)) == ["the=1", "the=2", "a=1", "the=4"]
    produce(client, topic, ["fox fox"])
    assert values(collect(client, f"{topic}-out", 1)) == ["fox=4"]  # the same subscription
    assert instance.metrics.user_exceptions == 0


def test_state_values_and_reads_of_own_writes(
    client: pulsar.Client,
    run_stateful: Callable[..., FunctionInstance],
    topic: str,
    script: Script,
) -> None:
    path = script(
        """
        function process(input, context) {
          const [op, key, value] = input.split(' ');
          if (op === 'put') context.putState(key, value);
          if (op === 'del') context.delCounter(key);
          if (op === 'incr') context.incrCounter(key, Number(value));
          if (op === 'bad') context.putState(key, {not: 'a string'});
          return op === 'incr' || op === 'count'
            ? key + '=' + context.getCounter(key)
            : key + ':' + context.getState(key);
        }
        """
    )
    produce(
        client,
        topic,
        [
            "get k",
            "put k v1",
            "get k",
            "put k v2",
            "incr c 5",
            "incr c -2",
            "bad k",
            "del k",
            "get k",
            "count c",
        ],
    )
    instance = run_stateful(
        js=path, inputs=[topic], output=f"{topic}-out", processing_guarantees="ATMOST_ONCE"
    )
    assert values(collect(client, f"{topic}-out", 9)) == [
        "k:null",
        "k:v1",
        "k:v1",
        "k:v2",
        "c=5",
        "c=3",
        "k:null",
        "k:null",
        "c=3",
    ]
    wait_for(lambda: instance.metrics.user_exceptions == 1)
    error = status(instance)["latestUserExceptions"][0]["exceptionString"]
    assert error.startswith("TypeError: putState(k, value) needs a string value")


# --- through `magnetar functions localrun --js` ------------------------------------------


@pytest.fixture
def localrun_js(cli_env: dict[str, str]) -> Iterator[Callable[..., LocalRunProcess]]:
    started: list[LocalRunProcess] = []

    def start(*args: str, global_args: tuple[str, ...] = ()) -> LocalRunProcess:
        started.append(LocalRunProcess(list(args), cli_env, list(global_args)))
        return started[-1]

    yield start
    for run in started:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()


def test_localrun_runs_a_javascript_function(
    localrun_js: Callable[..., LocalRunProcess], client: pulsar.Client, topic: str
) -> None:
    run = localrun_js(
        "--js",
        example("exclamation.js"),
        "--inputs",
        topic,
        "--output",
        f"{topic}-out",
        "--subs-position",
        "Earliest",
    )
    run.wait_for_stderr(r"Running public/default/exclamation \(1 instance\)")
    produce(client, topic, [f"msg-{i}" for i in range(10)])
    assert values(collect(client, f"{topic}-out", 10)) == [f"msg-{i}!" for i in range(10)]
    code, stdout = run.interrupt(signal.SIGINT)
    assert code == 0
    row = stdout.strip().splitlines()[1]
    assert row.split()[:6] == ["0", "no", "10", "10", "0", "0"]


def test_localrun_json_transform_user_config_and_errors_in_status(
    localrun_js: Callable[..., LocalRunProcess], client: pulsar.Client, topic: str, script: Script
) -> None:
    path = script(
        """
        function process(order, context) {
          if (order.amount < 0) throw new RangeError('negative amount ' + order.amount);
          if (order.amount === 0) while (true) {}
          return {id: order.id, total: order.amount * context.getUserConfigValue('factor')};
        }
        """
    )
    run = localrun_js(
        "--js",
        path,
        "--name",
        "orders",
        "--inputs",
        topic,
        "--custom-serde-inputs",
        json.dumps({topic: "json"}),
        "--output",
        f"{topic}-out",
        "--output-serde-classname",
        "json",
        "--user-config",
        '{"factor": 3}',
        "--timeout-ms",
        "300",
        "--processing-guarantees",
        "ATMOST_ONCE",
        "--subs-position",
        "Earliest",
        global_args=("--output", "json"),
    )
    run.wait_for_stderr("Running public/default/orders")
    orders = [{"id": 1, "amount": 2}, {"id": 2, "amount": -1}, {"id": 3, "amount": 0}]
    produce(client, topic, [json.dumps(o) for o in [*orders, {"id": 4, "amount": 5}]])
    out = [json.loads(m.data()) for m in collect(client, f"{topic}-out", 2)]
    assert out == [{"id": 1, "total": 6}, {"id": 4, "total": 15}]
    code, stdout = run.interrupt()
    assert code == 0
    status = json.loads(stdout)["instances"][0]["status"]
    assert status["numUserExceptions"] == 2
    errors = [e["exceptionString"] for e in status["latestUserExceptions"]]
    assert errors[0].startswith("RangeError: negative amount -1\n    at process (")
    assert errors[1] == "the function ran longer than its timeout of 300 ms"


def test_localrun_lets_url_bindings_reach_any_host(
    localrun_js: Callable[..., LocalRunProcess], client: pulsar.Client, topic: str, script: Script
) -> None:
    # the user's own code on the user's own machine: a service on localhost is reachable
    # without any setting (a worker's default refuses loopback addresses)
    path = script("function process(input) { return curl('GET', api, {path: input}).body.path; }")
    with http_endpoint() as server:
        run = localrun_js(
            "--js",
            path,
            "--inputs",
            topic,
            "--output",
            f"{topic}-out",
            "--url-bindings",
            json.dumps([{"alias": "api", "url": f"{server.base}/api"}]),
            "--subs-position",
            "Earliest",
        )
        run.wait_for_stderr("Running public/default/")
        produce(client, topic, ["a", "b"])
        assert values(collect(client, f"{topic}-out", 2)) == ["/api/a", "/api/b"]
        code, _ = run.interrupt(signal.SIGINT)
    assert code == 0


def test_localrun_reports_a_syntax_error_and_exits_non_zero(
    cli_env: dict[str, str], topic: str, script: Script
) -> None:
    path = script("function process(input) {\n  return input +;\n}\n")
    result = run_cli(["--js", path, "--inputs", topic], cli_env)
    assert result.returncode == 1
    assert (
        f"syntax error in {Path(path).name}, line 2, column 17: SyntaxError: Unexpected token ';'"
        in result.stderr
    )
    assert "Traceback" not in result.stderr
    both = run_cli(["--js", path, "--py", example("exclamation.py"), "--inputs", topic], cli_env)
    assert both.returncode == 1
    assert "set py (--py) or js (--js), not both" in both.stderr


def test_localrun_word_count_with_counters(
    localrun_js: Callable[..., LocalRunProcess],
    client: pulsar.Client,
    topic: str,
    tmp_path: Path,
) -> None:
    run = localrun_js(
        "--js",
        example("word_count.js"),
        "--inputs",
        topic,
        "--output",
        f"{topic}-out",
        "--subs-position",
        "Earliest",
        "--state-dir",
        str(tmp_path / "state"),
    )
    run.wait_for_stderr("Running public/default/word_count")
    produce(client, topic, ["to be or not to be", "to do is to be", "be quick"])
    assert values(collect(client, f"{topic}-out", 3)) == ["to=2", "to=4", "be=4"]
    assert run.interrupt()[0] == 0
