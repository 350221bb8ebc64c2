"""The main scenarios on a real Apache Pulsar: create a function, process messages, keep
state, lose a worker, and the broker policies the workers set through the admin API."""

from __future__ import annotations

import functools
import json
import textwrap
from pathlib import Path

import httpx
import pulsar
import pytest

from magnetar.worker.broker_policies import COMPACTION_THRESHOLD_BYTES
from tests.conftest import EXAMPLES
from tests.docker.conftest import (
    HostCluster,
    PulsarBroker,
    consume,
    produce,
    texts,
    wait_until,
)

# the first test here may also pull and start Pulsar (the session's broker)
pytestmark = [pytest.mark.docker, pytest.mark.timeout(900)]

WORD_COUNT = textwrap.dedent(
    """
    from pulsar import Function


    class WordCount(Function):
        def process(self, input, context):
            for word in input.split():
                context.incr_counter(word, 1)
            context.put_state("last", input)
            return input.upper()
    """
)


def answers(broker: PulsarBroker, path: str, value: object) -> bool:
    """Whether the admin API answers ``GET path`` with ``value`` (an unset policy has no body)."""
    response = broker.admin("GET", path)
    try:
        return bool(response.json() == value)
    except ValueError:
        return False


def test_a_function_processes_on_three_workers_and_survives_a_killed_leader(
    host_cluster: HostCluster, pulsar_client: pulsar.Client, topic: str
) -> None:
    workers = host_cluster.start(3)
    name = f"excl-{topic}"
    host_cluster.create(
        name,
        EXAMPLES / "exclamation.py",
        className="exclamation.ExclamationFunction",
        inputs=[f"{topic}-in"],
        output=f"{topic}-out",
        parallelism=3,
        subscriptionPosition="Earliest",
    )
    wait_until(lambda: host_cluster.running_instances(name) == 3, 60, "3 instances running")
    wait_until(
        lambda: (
            {w["workerId"] for w in host_cluster.get("/admin/v2/worker/cluster")}
            == {w.worker_id for w in workers}
        ),
        30,
        "all 3 workers in the cluster",
    )

    produce(pulsar_client, f"{topic}-in", [f"a{i}" for i in range(50)])
    first = consume(pulsar_client, f"{topic}-out", lambda got: len(set(texts(got))) >= 50)
    assert set(texts(first)) == {f"a{i}!" for i in range(50)}
    assert all(m.properties()["__pfn_input_topic__"].endswith(f"{topic}-in") for m in first)

    leader_id = host_cluster.get("/admin/v2/worker/cluster/leader")["workerId"]
    leader = host_cluster.workers[leader_id]
    host_cluster.kill(leader)
    survivors = host_cluster.alive()
    wait_until(
        lambda: len(host_cluster.get("/admin/v2/worker/cluster", via=survivors[0])) == 2,
        60,
        "the killed leader removed from the cluster",
    )
    new_leader = host_cluster.get("/admin/v2/worker/cluster/leader", via=survivors[0])
    assert new_leader["workerId"] in {w.worker_id for w in survivors}
    wait_until(
        lambda: leader_id not in host_cluster.get("/admin/v2/worker/assignments"),
        60,
        "the killed worker's instances reassigned",
    )
    wait_until(lambda: host_cluster.running_instances(name) == 3, 60, "3 instances again")

    produce(pulsar_client, f"{topic}-in", [f"b{i}" for i in range(50)])
    after = consume(
        pulsar_client, f"{topic}-out", lambda got: {f"b{i}!" for i in range(50)} <= set(texts(got))
    )
    assert {f"b{i}!" for i in range(50)} <= set(texts(after))  # nothing lost (at least once)


def test_state_is_kept_and_served_over_rest(
    host_cluster: HostCluster, pulsar_client: pulsar.Client, topic: str, tmp_path: Path
) -> None:
    host_cluster.start(2)
    code = tmp_path / "word_count.py"
    code.write_text(WORD_COUNT)
    name = f"count-{topic}"
    host_cluster.create(
        name,
        code,
        className="word_count.WordCount",
        inputs=[f"{topic}-in"],
        output=f"{topic}-out",
        subscriptionPosition="Earliest",
    )
    wait_until(lambda: host_cluster.running_instances(name) == 1, 60, "the instance running")

    produce(pulsar_client, f"{topic}-in", ["red green", "red blue", "red"])
    outputs = consume(pulsar_client, f"{topic}-out", lambda got: len(got) >= 3)
    assert sorted(set(texts(outputs))) == ["RED", "RED BLUE", "RED GREEN"]

    state = f"/admin/v3/functions/public/default/{name}/state"
    for worker in host_cluster.alive():  # any worker answers, wherever the instance runs
        assert host_cluster.get(f"{state}/red", via=worker)["numberValue"] == 3
        assert host_cluster.get(f"{state}/green", via=worker)["numberValue"] == 1
        assert host_cluster.get(f"{state}/last", via=worker)["stringValue"] == "red"


def test_workers_set_the_broker_policies_through_the_admin_api(
    host_cluster: HostCluster, pulsar_client: pulsar.Client, topic: str
) -> None:
    host_cluster.start(2)
    broker = host_cluster.broker
    tenant, namespace = host_cluster.system_namespace.split("/")
    system = f"/admin/v2/persistent/{tenant}/{namespace}"
    expected = {
        f"/admin/v2/namespaces/{tenant}/{namespace}/retention": {
            "retentionTimeInMinutes": -1,
            "retentionSizeInMB": -1,
        },
        f"{system}/coordinate/retention": {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0},
        **{
            f"{system}/{name}/compactionThreshold": COMPACTION_THRESHOLD_BYTES
            for name in ("metadata", "assignments", "packages")
        },
    }
    # topic policies reach the broker's cache through a system topic: a moment later
    for path, value in expected.items():
        wait_until(functools.partial(answers, broker, path, value), 30, f"GET {path} is {value}")

    name = f"once-{topic}"
    host_cluster.create(
        name,
        EXAMPLES / "exclamation.py",
        className="exclamation.ExclamationFunction",
        inputs=[f"{topic}-in"],
        output=f"{topic}-out",
        processingGuarantees="EFFECTIVELY_ONCE",
        subscriptionPosition="Earliest",
    )
    wait_until(lambda: host_cluster.running_instances(name) == 1, 60, "the instance running")
    dedup = f"/admin/v2/persistent/public/default/{topic}-out/deduplicationEnabled"
    wait_until(functools.partial(answers, broker, dedup, True), 30, "deduplication on")

    produce(pulsar_client, f"{topic}-in", [f"m{i}" for i in range(20)])
    outputs = consume(pulsar_client, f"{topic}-out", lambda got: len(got) >= 20)
    assert texts(outputs) == [f"m{i}!" for i in range(20)]  # in order, each once


def test_tenants_and_namespaces_are_the_brokers(host_cluster: HostCluster, topic: str) -> None:
    worker = host_cluster.start(1)[0]
    broker = host_cluster.broker

    def call(method: str, path: str, **kwargs: object) -> httpx.Response:
        return httpx.request(method, worker.url + path, timeout=30, **kwargs)  # type: ignore[arg-type]

    assert (
        call("GET", "/admin/v2/tenants").json() == broker.admin("GET", "/admin/v2/tenants").json()
    )
    tenant = f"t-{topic}"
    info = {"adminRoles": [], "allowedClusters": call("GET", "/admin/v2/clusters").json()}
    assert call("PUT", f"/admin/v2/tenants/{tenant}", json=info).status_code == 204
    assert broker.admin("GET", f"/admin/v2/tenants/{tenant}").status_code == 200
    again = call("PUT", f"/admin/v2/tenants/{tenant}", json=info)
    assert again.status_code == 409  # the broker's answer, relayed
    assert call("PUT", f"/admin/v2/namespaces/{tenant}/ns").status_code == 204
    assert f"{tenant}/ns" in broker.admin("GET", f"/admin/v2/namespaces/{tenant}").json()

    code = {"data": ("exclamation.py", (EXAMPLES / "exclamation.py").read_bytes())}
    config = {"className": "exclamation.ExclamationFunction", "inputs": [f"{topic}-in"]}
    for fqfn, reason in [
        (f"ghost-{topic}/ns/f", "Tenant does not exist"),
        (f"{tenant}/ghost/f", "Namespace does not exist"),
    ]:
        refused = call(
            "POST",
            f"/admin/v3/functions/{fqfn}",
            data={"functionConfig": json.dumps(config)},
            files=code,
        )
        assert (refused.status_code, refused.json()) == (400, {"reason": reason})
    created = call(
        "POST",
        f"/admin/v3/functions/{tenant}/ns/f",
        data={"functionConfig": json.dumps(config)},
        files=code,
    )
    assert created.status_code == 204, created.text
