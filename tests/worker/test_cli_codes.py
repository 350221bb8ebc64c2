"""The CLI as `pulsar-admin`: `tenants` and `namespaces` with its verbs and flags, the
confirmations it prints, and a refusal printed as it prints one (the reason, a blank line,
``Reason: ...``) with exit code 1."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner, Result

from magnetar.cli import main
from tests.conftest import EXAMPLES
from tests.worker.conftest import InProcessCluster

CODE = ["--py", str(EXAMPLES / "exclamation.py"), "--classname", "exclamation.ExclamationFunction"]


def run(cluster: InProcessCluster, *args: str, output: str = "table") -> Result:
    options = ["--admin-url", cluster.url("follower"), "--output", output]
    return CliRunner().invoke(main, [*options, *args])


def ok(cluster: InProcessCluster, *args: str) -> str:
    result = run(cluster, *args)
    assert result.exit_code == 0, result.output
    return result.output


def refused(reason: str) -> str:
    return f"{reason}\n\nReason: {reason}\n"


def test_tenants_and_namespaces_with_pulsar_admins_verbs(rest_cluster: InProcessCluster) -> None:
    system = rest_cluster.settings["system_namespace"]
    assert ok(rest_cluster, "tenants", "list") == "public\n"
    assert json.loads(ok(rest_cluster, "tenants", "get", "public")) == {
        "adminRoles": [],
        "allowedClusters": ["standalone"],
    }
    assert ok(rest_cluster, "tenants", "create", "acme", "-r", "ops,dev") == ""
    assert json.loads(ok(rest_cluster, "tenants", "get", "acme")) == {
        "adminRoles": ["dev", "ops"],
        "allowedClusters": ["standalone"],  # all clusters, as pulsar-admin defaults
    }
    assert ok(rest_cluster, "tenants", "update", "acme", "--admin-roles", "ops") == ""
    assert json.loads(ok(rest_cluster, "tenants", "get", "acme"))["adminRoles"] == ["ops"]
    assert ok(rest_cluster, "namespaces", "create", "acme/prod", "--bundles", "4") == ""
    assert ok(rest_cluster, "namespaces", "list", "acme") == "acme/prod\n"
    listed = run(rest_cluster, "namespaces", "list", "public", output="json")
    assert json.loads(listed.output) == sorted(["public/default", system])

    created = ok(
        rest_cluster, "functions", "create", *CODE, "--fqfn", "acme/prod/shout", "--inputs", "x"
    )
    assert created == "Created successfully\n"
    busy = run(rest_cluster, "namespaces", "delete", "acme/prod")
    assert (busy.exit_code, busy.output) == (1, refused("Cannot delete non empty namespace"))
    assert ok(rest_cluster, "functions", "delete", "--fqfn", "acme/prod/shout") == (
        "Deleted successfully\n"
    )
    assert ok(rest_cluster, "namespaces", "delete", "acme/prod") == ""
    assert ok(rest_cluster, "tenants", "delete", "acme") == ""
    assert ok(rest_cluster, "tenants", "list") == "public\n"


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (("tenants", "get", "ghost"), "Tenant does not exist"),
        (("tenants", "create", "public"), "Tenant already exist"),
        (("tenants", "create", "t2", "-c", "mars"), "Clusters do not exist"),
        (("tenants", "delete", "ghost"), "Tenant doesn't exist"),
        (("tenants", "delete", "public"), "The tenant still has active namespaces"),
        (("namespaces", "list", "ghost"), "Tenant not found"),
        (("namespaces", "create", "public/default"), "Namespace already exists"),
        (("namespaces", "create", "ghost/ns"), "Tenant does not exist"),
        (("namespaces", "delete", "public/ghost"), "Namespace public/ghost does not exist."),
        (("functions", "status", "--name", "ghost"), "Function ghost doesn't exist"),
        (
            ("functions", "create", *CODE, "--fqfn", "public/nowhere/f", "--inputs", "x"),
            "Namespace does not exist",
        ),
        (
            ("functions", "update", "--name", "ghost", "--parallelism", "2"),
            "Function ghost doesn't exist",
        ),
        (
            ("functions", "trigger", "--name", "ghost", "--trigger-value", "v"),
            "Function ghost doesn't exist",
        ),
    ],
)
def test_refusals_print_the_reason_as_pulsar_admin_and_exit_1(
    rest_cluster: InProcessCluster, args: tuple[str, ...], reason: str
) -> None:
    result = run(rest_cluster, *args)
    assert (result.exit_code, result.output) == (1, refused(reason))


def test_function_changes_confirm_and_refuse_as_pulsar_admin(
    rest_cluster: InProcessCluster,
) -> None:
    create = ["functions", "create", *CODE, "--name", "loud", "--inputs", "loud-in"]
    assert ok(rest_cluster, *create) == "Created successfully\n"
    again = run(rest_cluster, *create)
    assert (again.exit_code, again.output) == (1, refused("Function loud already exists"))
    same = run(rest_cluster, "functions", "update", "--name", "loud", "--parallelism", "1")
    assert (same.exit_code, same.output) == (1, refused("Update contains no change"))
    assert ok(rest_cluster, "functions", "update", "--name", "loud", "--parallelism", "2") == (
        "Updated successfully\n"
    )
    started = run(rest_cluster, "functions", "start", "--name", "loud")
    assert (started.exit_code, started.output) == (1, refused("Operation not permitted"))
    for verb, past in [("stop", "Stopped"), ("start", "Started")]:
        assert ok(rest_cluster, "functions", verb, "--name", "loud", "--instance-id", "1") == (
            f"{past} successfully\n"
        )
    deadline = time.monotonic() + 20  # restarting needs the instance scheduled again
    while (
        json.loads(
            run(rest_cluster, "functions", "status", "--name", "loud", output="json").output
        )["numRunning"]
        != 2
    ):
        assert time.monotonic() < deadline, "instance 1 did not run again"
        time.sleep(0.1)
    assert ok(rest_cluster, "functions", "restart", "--name", "loud", "--instance-id", "1") == (
        "Restarted successfully\n"
    )
    assert ok(rest_cluster, "functions", "delete", "--name", "loud") == "Deleted successfully\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("functions", "get"),
            "You must specify a name for the function or a Fully Qualified Function Name (FQFN)",
        ),
        (
            ("functions", "get", "--fqfn", "only/two"),
            "Fully qualified function names (FQFNs) must be of the form tenant/namespace/name",
        ),
        (
            ("functions", "get", "--fqfn", "a/b/c", "--name", "c"),
            "You must specify either a Fully Qualified Function Name (FQFN) or tenant, "
            "namespace, and function name",
        ),
        (
            ("functions", "trigger", "--name", "x"),
            "Either a trigger value or a trigger filepath needs to be specified",
        ),
    ],
)
def test_usage_errors_say_what_pulsar_admin_says(
    rest_cluster: InProcessCluster, args: tuple[str, ...], message: str
) -> None:
    result = run(rest_cluster, *args)
    assert result.exit_code == 2 and message in result.output, result.output
