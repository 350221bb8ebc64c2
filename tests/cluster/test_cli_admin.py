"""A person at the CLI, against `magnetar standalone --workers 3`: every `functions` and
`functions-worker` command, tables and JSON, and the errors they print."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from magnetar.cli import main
from magnetar.cli.function_admin import register_admin_commands
from magnetar.cli.functions_worker import functions_worker
from tests.cluster.conftest import wait_until
from tests.cluster.test_standalone import three_worker_standalone
from tests.conftest import EXAMPLES

EXCLAMATION = [
    "--py",
    str(EXAMPLES / "exclamation.py"),
    "--classname",
    "exclamation.ExclamationFunction",
]


class Standalone:
    def __init__(self, urls: list[str]) -> None:
        self.urls = urls

    def run(self, *args: str, url: int = 1, output: str = "table") -> Result:
        """The CLI, in this process, against worker ``url`` (the second by default)."""
        options = ["--admin-url", self.urls[url], "--output", output]
        return CliRunner().invoke(main, [*options, *args])

    def ok(self, *args: str, url: int = 1) -> str:
        result = self.run(*args, url=url)
        assert result.exit_code == 0, result.output
        return result.output

    def json(self, *args: str, url: int = 1) -> object:
        result = self.run(*args, url=url, output="json")
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    def running(self, name: str) -> int:
        status = self.json("functions", "status", "--name", name)
        assert isinstance(status, dict)
        return int(status["numRunning"])


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    with three_worker_standalone(tmp_path_factory.mktemp("standalone")) as urls:
        yield Standalone(urls)


def test_create_status_trigger_stats_update_delete(standalone: Standalone, tmp_path: Path) -> None:
    created = standalone.ok(
        "functions",
        "create",
        *EXCLAMATION,
        "--name",
        "shout",
        "--inputs",
        "cli-in",
        "--output",
        "cli-out",
        "--parallelism",
        "3",
        "--user-config",
        '{"level": 2}',
    )
    assert created.strip() == "Created successfully"
    wait_until(lambda: standalone.running("shout") == 3, 20, "three instances")

    table = standalone.ok("functions", "status", "--name", "shout", url=0)
    assert table.splitlines()[0] == "public/default/shout: 3 of 3 instances running"
    assert table.splitlines()[1].split() == [
        "instance",
        "running",
        "worker",
        "received",
        "processed",
        "user",
        "exc",
        "system",
        "exc",
        "restarts",
        "avg",
        "ms",
        "error",
    ]
    assert sorted(line.split()[2] for line in table.splitlines()[2:]) == [
        "worker-1",
        "worker-2",
        "worker-3",
    ]
    config = standalone.json("functions", "get", "--fqfn", "public/default/shout")
    assert isinstance(config, dict)
    assert config["userConfig"] == {"level": 2} and config["parallelism"] == 3
    rows = standalone.ok("functions", "get", "--name", "shout").splitlines()
    assert ["userConfig", '{"level":', "2}"] in [row.split() for row in rows]
    assert ["runtime", "PYTHON"] in [row.split() for row in rows]  # Pulsar's defaults too
    assert standalone.json("functions", "list") == ["shout"]

    assert (
        standalone.ok("functions", "trigger", "--name", "shout", "--trigger-value", "hi") == "hi!\n"
    )
    value = tmp_path / "value.txt"
    value.write_text("from a file")
    triggered = standalone.ok(
        "functions", "trigger", "--name", "shout", "--trigger-file", str(value), "--topic", "cli-in"
    )
    assert triggered == "from a file!\n"
    wait_until(
        lambda: (
            (s := standalone.json("functions", "stats", "--name", "shout"))
            and isinstance(s, dict)
            and s["processedSuccessfullyTotal"] == 2
        ),
        10,
        "two processed",
    )
    stats = standalone.ok("functions", "stats", "--name", "shout")
    assert stats.splitlines()[-1].split()[:3] == ["all", "2", "2"]

    assert standalone.ok(
        "functions", "update", "--name", "shout", "--parallelism", "2"
    ).strip() == ("Updated successfully")
    wait_until(lambda: standalone.running("shout") == 2, 20, "scaled to two")

    assert standalone.ok("functions", "stop", "--name", "shout", "--instance-id", "1").strip() == (
        "Stopped successfully"
    )
    # the stopped instance says "stopping" until it has drained; the update's restart of
    # instance 0 may still be under way too, so the count alone says nothing about instance 1
    wait_until(
        lambda: (
            (one := standalone.json("functions", "status", "--name", "shout", "--instance-id", "1"))
            and isinstance(one, dict)
            and (one["running"], one["error"]) == (False, "stopped")
        ),
        20,
        "instance 1 stopped",
    )
    wait_until(lambda: standalone.running("shout") == 1, 20, "one running")
    standalone.ok("functions", "start", "--name", "shout")
    wait_until(lambda: standalone.running("shout") == 2, 20, "started again")
    standalone.ok("functions", "restart", "--name", "shout", "--instance-id", "0")
    wait_until(
        lambda: (
            (s := standalone.json("functions", "status", "--name", "shout"))
            and isinstance(s, dict)
            and s["instances"][0]["status"]["numRestarts"] == 1
            and s["numRunning"] == 2
        ),
        20,
        "instance 0 restarted",
    )

    assert standalone.ok("functions", "delete", "--name", "shout").strip() == (
        "Deleted successfully"
    )
    assert standalone.json("functions", "list") == []


def test_create_from_a_yaml_config_file(standalone: Standalone, tmp_path: Path) -> None:
    config = tmp_path / "fn.yaml"
    config.write_text(
        f"name: greeter\ntenant: public\nnamespace: default\npy: {EXAMPLES / 'user_config.py'}\n"
        "className: user_config.GreetingFunction\ninputs: [yaml-in]\noutput: yaml-out\n"
        "userConfig:\n  greeting: Hi\n  times: 2\n"
    )
    assert standalone.ok("functions", "create", "--function-config-file", str(config)).strip() == (
        "Created successfully"
    )
    wait_until(lambda: standalone.running("greeter") == 1, 20, "greeter running")
    greeting = standalone.ok("functions", "trigger", "--name", "greeter", "--trigger-value", "Ann")
    assert greeting == "Hi, Ann Hi, Ann\n"
    standalone.ok("functions", "delete", "--name", "greeter")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            ("functions", "status", "--name", "ghost"),
            1,
            "Function ghost doesn't exist\n\nReason: Function ghost doesn't exist",
        ),
        (
            (
                "functions",
                "create",
                *EXCLAMATION,
                "--name",
                "loop",
                "--inputs",
                "x",
                "--output",
                "x",
            ),
            1,
            "is also an input topic",
        ),
        (
            ("functions", "create", "--name", "nocode", "--inputs", "x"),
            2,
            "pass the function's code: --py FILE",
        ),
        (
            ("functions", "create", "--py", "missing.py", "--name", "m", "--inputs", "x"),
            2,
            "missing.py does not exist",
        ),
        (
            ("functions", "get", "--fqfn", "only/two"),
            2,
            "Fully qualified function names (FQFNs) must be of the form tenant/namespace/name",
        ),
        (
            ("functions", "get", "--fqfn", "a/b/c", "--name", "c"),
            2,
            "You must specify either a Fully Qualified Function Name (FQFN) or tenant, namespace",
        ),
        (("functions", "status"), 2, "You must specify a name for the function"),
        (
            ("functions", "trigger", "--name", "x"),
            2,
            "Either a trigger value or a trigger filepath needs to be specified",
        ),
        (
            (
                "functions",
                "create",
                *EXCLAMATION,
                "--name",
                "j",
                "--inputs",
                "x",
                "--user-config",
                "{",
            ),
            2,
            "--user-config must be JSON",
        ),
        (
            ("functions-worker", "drain", "--worker-id", "ghost"),
            1,
            "Reason: Worker ghost is not among the current workers in the system",
        ),
    ],
)
def test_errors_print_the_reason_and_exit_non_zero(
    standalone: Standalone, args: tuple[str, ...], code: int, message: str
) -> None:
    result = standalone.run(*args)
    assert result.exit_code == code, result.output
    assert message in result.output


def test_an_unreachable_worker_is_named() -> None:
    result = CliRunner().invoke(main, ["--admin-url", "http://127.0.0.1:9", "functions", "list"])
    assert result.exit_code == 1
    assert "cannot reach the Magnetar worker at http://127.0.0.1:9" in result.output


_LOADED_BY_LIST = """
import sys
from magnetar.cli import main
try:
    main(["--admin-url", "http://127.0.0.1:9", "functions", "list"], standalone_mode=False)
except Exception as error:
    print(error, file=sys.stderr)
heavy = ("fastapi", "pulsar", "pydantic", "pyspark", "httpx")
heavy += ("magnetar.worker", "magnetar.instance")
print(" ".join(sorted(name for name in sys.modules if name.startswith(heavy))))
"""


def test_functions_list_loads_only_what_it_needs() -> None:
    # A command answers in the time its imports take: the worker, the clients and pydantic
    # together cost a second, and an admin command needs none of them.
    result = subprocess.run(
        [sys.executable, "-c", _LOADED_BY_LIST], capture_output=True, text=True, check=True
    )
    assert "cannot reach the Magnetar worker at http://127.0.0.1:9" in result.stderr
    assert result.stdout.split() == []


def test_every_admin_command_has_help_with_an_example() -> None:
    group = type(functions_worker)("probe")
    register_admin_commands(group)
    commands = [*group.commands.values(), *functions_worker.commands.values()]
    for command in commands:
        if command.name in {
            "get-cluster-leader",
            "function-stats",
            "rebalance",
            "get-drain-status",
        }:
            continue  # one-liners with nothing to choose
        assert "Example:" in (command.help or ""), command.name


def test_functions_worker_commands(standalone: Standalone) -> None:
    members = standalone.json("functions-worker", "get-cluster")
    assert isinstance(members, list)
    assert sorted(m["workerId"] for m in members) == ["worker-1", "worker-2", "worker-3"]
    leader = standalone.ok("functions-worker", "get-cluster-leader")
    assert leader.splitlines()[0].split() == ["worker", "admin", "url"]
    standalone.ok(
        "functions",
        "create",
        *EXCLAMATION,
        "--name",
        "spread",
        "--inputs",
        "w-in",
        "--parallelism",
        "3",
    )
    wait_until(lambda: standalone.running("spread") == 3, 20, "three instances")
    assignments = standalone.json("functions-worker", "get-function-assignments")
    assert isinstance(assignments, dict)
    assert sorted(k for keys in assignments.values() for k in keys) == [
        f"public/default/spread:{i}" for i in range(3)
    ]
    table = standalone.ok("functions-worker", "get-function-assignments")
    assert table.splitlines()[0].split() == ["worker", "instance"] and len(table.splitlines()) == 4
    assert standalone.ok("functions-worker", "rebalance").strip() == "Rebalance requested"
    local = standalone.json("functions-worker", "function-stats", url=2)
    assert isinstance(local, list) and [s["name"] for s in local] == assignments["worker-3"]

    assert standalone.ok("functions-worker", "drain", "--worker-id", "worker-3").strip() == (
        "Draining worker-3"
    )
    wait_until(
        lambda: (
            (
                s := standalone.json(
                    "functions-worker", "get-drain-status", "--worker-id", "worker-3"
                )
            )
            and isinstance(s, dict)
            and s["status"] == "SUCCESS"
        ),
        20,
        "worker-3 drained",
    )
    wait_until(lambda: standalone.running("spread") == 3, 20, "running on the others")
    drained = standalone.ok("functions-worker", "get-drain-status", url=2)
    assert drained.splitlines()[1].split() == ["worker-3", "SUCCESS", "0"]


def test_create_a_javascript_function(standalone: Standalone) -> None:
    script = str(EXAMPLES / "exclamation.js")
    created = standalone.ok(
        "functions", "create", "--js", script, "--inputs", "js-in", "--output", "js-out"
    )
    assert created.strip() == "Created successfully"
    config = standalone.json("functions", "get", "--name", "exclamation")
    assert isinstance(config, dict) and config["js"] == "exclamation.js" and "py" not in config
    wait_until(lambda: standalone.running("exclamation") == 1, 20, "script running")
    assert (
        standalone.ok("functions", "trigger", "--name", "exclamation", "--trigger-value", "v8")
        == "v8!\n"
    )
    both = standalone.run(
        "functions", "create", "--js", script, "--py", script, "--name", "x", "--inputs", "y"
    )
    assert both.exit_code != 0 and "--py" in both.output and "--js" in both.output
    standalone.ok("functions", "delete", "--name", "exclamation")
