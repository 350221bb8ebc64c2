"""Apache Pulsar's own `pulsar-admin` (pulsar-client-tools, from Maven Central) against
`magnetar standalone --workers 3`, unchanged: every verb of `functions`, `functions-worker`,
`tenants` and `namespaces` that a functions worker serves, with its output and exit code.

The commands run through PulsarAdminTool's own entry point in one JVM (a JVM per command
costs seconds of CPU); one test runs the CLI as a process of its own, as bin/pulsar-admin does.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from magnetar.testing.pulsar_admin import AdminShell, PulsarAdmin
from tests.cluster.conftest import wait_until
from tests.cluster.test_standalone import three_worker_standalone
from tests.conftest import EXAMPLES

FUNCTIONS = "/admin/v3/functions/public/default"


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """The admin URLs of a three-worker standalone."""
    with three_worker_standalone(tmp_path_factory.mktemp("standalone")) as found:
        yield found


@pytest.fixture(scope="module")
def pulsar_admin(urls: list[str]) -> Iterator[PulsarAdmin]:
    """pulsar-admin pointed at the second worker (not the leader, most of the time)."""
    admin = PulsarAdmin(urls[1])
    yield admin
    admin.close()


@pytest.fixture(scope="module")
def shell(pulsar_admin: PulsarAdmin) -> Iterator[AdminShell]:
    with pulsar_admin.shell() as opened:
        yield opened


def ok(shell: AdminShell, *args: str) -> str:
    """A command that succeeds: exit code 0; its stdout."""
    done = shell.run(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr[-2000:])
    return done.stdout


def refused(shell: AdminShell, reason: str, *args: str) -> None:
    """A command Magnetar refuses: exit code 1 and Pulsar's reason on stderr."""
    done = shell.run(*args)
    assert done.returncode == 1, (args, done.stdout, done.stderr[-2000:])
    assert f"Reason: {reason}" in done.stderr, (args, done.stderr[-2000:])


def running(url: str, name: str) -> int:
    status = httpx.get(f"{url}{FUNCTIONS}/{name}/status", timeout=30)
    return int(status.json()["numRunning"]) if status.status_code == 200 else -1


def test_the_cli_runs_as_its_own_process(pulsar_admin: PulsarAdmin) -> None:
    listed = pulsar_admin.run("tenants", "list")
    assert (listed.returncode, listed.stdout.split()) == (0, ["public"]), listed.stderr[-2000:]
    missing = pulsar_admin.run("functions", "get", "--name", "ghost")
    assert missing.returncode == 1
    assert "Reason: Function ghost doesn't exist" in missing.stderr


def test_functions_verbs(shell: AdminShell, urls: list[str], tmp_path: Path) -> None:
    topic = f"pa-{uuid.uuid4().hex[:6]}"
    code = str(EXAMPLES / "exclamation.py")
    created = ok(
        shell,
        *("functions", "create", "--py", code, "--classname", "exclamation.ExclamationFunction"),
        *("--inputs", topic, "--output", f"{topic}-out", "--name", "excl"),
        *("--parallelism", "2", "--user-config", '{"level": 1}'),
    )
    assert created.strip() == "Created successfully"
    refused(
        shell,
        "Function excl already exists",
        *("functions", "create", "--py", code, "--classname", "exclamation.Exclamation"),
        *("--inputs", topic, "--name", "excl"),
    )

    # Pulsar's FunctionConfig, as the Java client reads it and the CLI prints it (Gson)
    config = json.loads(ok(shell, "functions", "get", "--name", "excl"))
    assert {key: config[key] for key in ("tenant", "namespace", "name", "runtime")} == {
        "tenant": "public",
        "namespace": "default",
        "name": "excl",
        "runtime": "PYTHON",
    }
    assert config["inputSpecs"] == {
        topic: {
            "isRegexPattern": False,
            "schemaProperties": {},
            "consumerProperties": {},
            "poolMessages": False,
        }
    }
    assert (config["autoAck"], config["parallelism"], config["userConfig"]) == (
        True,
        2,
        {"level": 1},
    )
    assert config["resources"] == {"cpu": 1.0, "ram": 1073741824, "disk": 10737418240}
    assert ok(shell, "functions", "list").split() == ["excl"]

    wait_until(lambda: running(urls[0], "excl") == 2, 60, "two instances running")
    status = json.loads(ok(shell, "functions", "status", "--name", "excl"))
    assert (status["numInstances"], status["numRunning"]) == (2, 2)
    assert {i["status"]["workerId"] for i in status["instances"]} <= {
        "worker-1",
        "worker-2",
        "worker-3",
    }
    one = json.loads(ok(shell, "functions", "status", "--name", "excl", "--instance-id", "1"))
    assert one["running"] is True
    for bad in ("-1", "2"):
        refused(
            shell,
            f"Function excl doesn't have instance with id {bad}",
            *("functions", "status", "--name", "excl", "--instance-id", bad),
        )
        refused(
            shell,
            f"Function excl doesn't have instance with id {bad}",
            *("functions", "stats", "--name", "excl", "--instance-id", bad),
        )

    triggered = ok(shell, "functions", "trigger", "--name", "excl", "--trigger-value", "hi")
    assert triggered.strip() == "hi!"
    # an instance reports its counts every two seconds: the trigger's answer may come first

    def stats_of_excl() -> dict[str, Any]:
        found: dict[str, Any] = json.loads(ok(shell, "functions", "stats", "--name", "excl"))
        return found

    wait_until(
        lambda: stats_of_excl()["processedSuccessfullyTotal"] == 1, 30, "the trigger counted"
    )
    stats = stats_of_excl()
    assert stats["receivedTotal"] == 1 and stats["processedSuccessfullyTotal"] == 1
    assert len(stats["instances"]) == 2
    instance = json.loads(ok(shell, "functions", "stats", "--name", "excl", "--instance-id", "0"))
    assert set(instance) >= {"receivedTotal", "avgProcessLatency", "1min", "userMetrics"}

    updated = ok(shell, "functions", "update", "--name", "excl", "--parallelism", "3")
    assert updated.strip() == "Updated successfully"
    refused(
        shell,
        "Update contains no change",
        *("functions", "update", "--name", "excl", "--parallelism", "3"),
    )
    wait_until(lambda: running(urls[0], "excl") == 3, 60, "three instances running")
    steps = [
        (("stop", "--instance-id", "0"), "Stopped successfully", 2),
        (("start", "--instance-id", "0"), "Started successfully", 3),
        (("stop",), "Stopped successfully", 0),
        (("start",), "Started successfully", 3),
        (("restart", "--instance-id", "1"), "Restarted successfully", 3),
        (("restart",), "Restarted successfully", 3),
    ]
    for step, answer, count in steps:
        assert ok(shell, "functions", step[0], "--name", "excl", *step[1:]).strip() == answer
        wait_until(lambda n=count: running(urls[0], "excl") == n, 60, f"{step}: {count}")
    refused(shell, "Operation not permitted", "functions", "start", "--name", "excl")

    state = '{"key": "greeting", "stringValue": "hello"}'
    ok(shell, "functions", "putstate", "--name", "excl", "--state", state)
    queried = json.loads(
        ok(shell, "functions", "querystate", "--name", "excl", "--key", "greeting")
    )
    assert queried == {"key": "greeting", "stringValue": "hello", "version": 0}
    refused(
        shell,
        "Setting Counter values not supported in put state",
        *("functions", "putstate", "--name", "excl", "--state", '{"key": "k"}'),
    )
    refused(
        shell,
        "key 'absent' doesn't exist.",
        *("functions", "querystate", "--name", "excl", "--key", "absent"),
    )

    downloaded = tmp_path / "downloaded.py"
    assert ok(
        shell, "functions", "download", "--name", "excl", "--destination-file", str(downloaded)
    ).strip() == ("Downloaded successfully")
    assert downloaded.read_bytes() == (EXAMPLES / "exclamation.py").read_bytes()
    assert ok(shell, "functions", "available-functions").strip() == ""  # no built-ins

    assert ok(shell, "functions", "delete", "--name", "excl").strip() == "Deleted successfully"
    assert ok(shell, "functions", "list").strip() == ""
    refused(shell, "Function excl doesn't exist", "functions", "get", "--name", "excl")
    refused(shell, "Function excl doesn't exist", "functions", "delete", "--name", "excl")
    refused(
        shell,
        "Function excl doesn't exist",
        *("functions", "querystate", "--name", "excl", "--key", "greeting"),
    )


def test_functions_worker_verbs(shell: AdminShell, urls: list[str]) -> None:
    topic = f"pw-{uuid.uuid4().hex[:6]}"
    ok(
        shell,
        *("functions", "create", "--py", str(EXAMPLES / "exclamation.py")),
        *("--classname", "exclamation.ExclamationFunction", "--inputs", topic, "--name", "pw"),
    )
    wait_until(lambda: running(urls[0], "pw") == 1, 60, "pw running")
    # one JSON object per worker, one after the other
    workers = json.loads(
        "[" + ok(shell, "functions-worker", "get-cluster").replace("}\n{", "},{") + "]"
    )
    assert [(w["workerId"], w["port"]) for w in workers] == [
        (f"worker-{i + 1}", int(url.rsplit(":", 1)[1])) for i, url in enumerate(urls)
    ]
    leader = json.loads(ok(shell, "functions-worker", "get-cluster-leader"))
    assert leader["workerId"] in {w["workerId"] for w in workers}
    assignments = ok(shell, "functions-worker", "get-function-assignments")
    assert "[public/default/pw:0]" in assignments
    # function-stats: the instances this worker (worker-2) runs
    here = [line for line in assignments.splitlines() if line.startswith("worker-2 ")]
    stats = ok(shell, "functions-worker", "function-stats")
    assert ('"name" : "public/default/pw:0"' in stats) == ("pw:0" in "".join(here)), stats
    metrics = json.loads(ok(shell, "functions-worker", "monitoring-metrics"))
    assert metrics[0]["dimensions"] == {"workerId": "worker-2"}
    assert metrics[0]["metrics"]["cluster.workers"] == 3
    rebalanced = ok(shell, "functions-worker", "rebalance")
    assert rebalanced.strip() == "Rebalance command sent successfully"
    ok(shell, "functions", "delete", "--name", "pw")


def test_tenants_and_namespaces_verbs(shell: AdminShell) -> None:
    tenant = f"acme{uuid.uuid4().hex[:4]}"
    assert ok(shell, "tenants", "list").split() == ["public"]
    assert json.loads(ok(shell, "tenants", "get", "public")) == {
        "adminRoles": [],
        "allowedClusters": ["standalone"],
    }
    ok(shell, "tenants", "create", tenant, "--allowed-clusters", "standalone")
    refused(shell, "Tenant already exist", "tenants", "create", tenant)
    ok(shell, "tenants", "update", tenant, "--admin-roles", "ops")
    assert json.loads(ok(shell, "tenants", "get", tenant))["adminRoles"] == ["ops"]
    assert sorted(ok(shell, "tenants", "list").split()) == sorted(["public", tenant])

    assert "public/default" in ok(shell, "namespaces", "list", "public").split()
    ok(shell, "namespaces", "create", f"{tenant}/apps")
    refused(shell, "Namespace already exists", "namespaces", "create", f"{tenant}/apps")
    assert ok(shell, "namespaces", "list", tenant).split() == [f"{tenant}/apps"]
    refused(shell, "The tenant still has active namespaces", "tenants", "delete", tenant)
    ok(shell, "namespaces", "delete", f"{tenant}/apps")
    assert ok(shell, "namespaces", "list", tenant).strip() == ""
    ok(shell, "tenants", "delete", tenant)
    refused(shell, "Tenant does not exist", "tenants", "get", tenant)
    assert ok(shell, "tenants", "list").split() == ["public"]


def test_packages_verbs_and_a_function_from_a_package(
    shell: AdminShell, urls: list[str], tmp_path: Path
) -> None:
    name = f"pkg{uuid.uuid4().hex[:6]}"
    url = f"function://public/default/{name}@v1"
    code = str(EXAMPLES / "exclamation.py")
    uploaded = ok(
        shell,
        *("packages", "upload", url, "--path", code, "--description", "shouts"),
        *("--properties", "team=a"),
    )
    assert uploaded.strip() == f"The package '{url}' uploaded from path '{code}' successfully"
    metadata = json.loads(ok(shell, "packages", "get-metadata", url))
    assert (metadata["description"], metadata["properties"]) == ("shouts", {"team": "a"})
    ok(shell, "packages", "update-metadata", url, "--description", "louder")
    assert json.loads(ok(shell, "packages", "get-metadata", url))["description"] == "louder"
    assert ok(shell, "packages", "list-versions", url.rsplit("@", 1)[0]).split() == ["v1"]
    assert (
        url.rsplit("@", 1)[0]
        in ok(shell, "packages", "list", "--type", "function", "public/default").split()
    )
    downloaded = tmp_path / "downloaded.py"
    ok(shell, "packages", "download", url, "--path", str(downloaded))
    assert downloaded.read_bytes() == (EXAMPLES / "exclamation.py").read_bytes()

    topic = f"pp-{uuid.uuid4().hex[:6]}"
    created = ok(
        shell,
        *("functions", "create", "--py", url, "--classname", "exclamation.ExclamationFunction"),
        *("--inputs", topic, "--output", f"{topic}-out", "--name", name),
    )
    assert created.strip() == "Created successfully"
    wait_until(lambda: running(urls[0], name) == 1, 60, "the packaged function running")
    assert ok(shell, "functions", "trigger", "--name", name, "--trigger-value", "hi").strip() == (
        "hi!"
    )
    ok(shell, "functions", "delete", "--name", name)
    ok(shell, "packages", "delete", url)

    # functions upload/download --path: a file kept at a path of one's choosing
    kept = f"files/{name}/exclamation.py"
    assert (
        ok(shell, "functions", "upload", "--source-file", code, "--path", kept).strip()
        == "Uploaded successfully"
    )
    fetched = tmp_path / "fetched.py"
    assert (
        ok(
            shell, "functions", "download", "--path", kept, "--destination-file", str(fetched)
        ).strip()
        == "Downloaded successfully"
    )
    assert fetched.read_bytes() == (EXAMPLES / "exclamation.py").read_bytes()
    refused(
        shell,
        f"Package '{url}' metadata does not exist",
        *("packages", "get-metadata", url),
    )
