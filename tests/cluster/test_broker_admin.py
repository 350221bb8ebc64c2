"""What workers ask of Apache Pulsar through its admin API, and what only a broker with one
offers: retention, compaction and deduplication policies; the metadata replayed after the
broker compacted it; EFFECTIVELY_ONCE outputs the broker deduplicates; partitioned inputs."""

from __future__ import annotations

import functools
import json
import subprocess
import threading
import time
import uuid
from collections import Counter

import httpx
import pulsar
import pytest

from magnetar.worker.broker_policies import COMPACTION_THRESHOLD_BYTES
from tests.cluster.conftest import Cluster, wait_until
from tests.cluster.test_cluster import instance_processes, running
from tests.conftest import EXAMPLES, ApachePulsar
from tests.integration.conftest import collect, values
from tests.worker.conftest import receive_until

pytestmark = pytest.mark.brokers("apache")

PARTITIONS = 3


def answers(broker: ApachePulsar, path: str, value: object) -> bool:
    """Whether the admin API answers ``GET path`` with ``value`` (an unset policy has no body)."""
    response = broker.admin("GET", path)
    try:
        return bool(response.json() == value)
    except ValueError:
        return False


def test_workers_set_the_broker_policies_through_the_admin_api(
    cluster: Cluster, apache_pulsar: ApachePulsar, cluster_client: pulsar.Client
) -> None:
    worker = cluster.start_worker("w1")
    cluster.start_worker("w2")
    system = f"/admin/v2/persistent/public/{cluster.namespace}"
    expected = {
        f"/admin/v2/namespaces/public/{cluster.namespace}/retention": {
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
        wait_until(functools.partial(answers, apache_pulsar, path, value), 30, f"{path} {value}")

    topic = f"once-{uuid.uuid4().hex[:6]}"
    response = cluster.create(
        worker,
        "once",
        inputs=[topic],
        output=f"{topic}-out",
        processingGuarantees="EFFECTIVELY_ONCE",
        subscriptionPosition="Earliest",
    )
    assert response.is_success, response.text
    wait_until(lambda: running(cluster, worker, "once") == 1, 30, "the instance running")
    dedup = f"/admin/v2/persistent/public/default/{topic}-out/deduplicationEnabled"
    wait_until(functools.partial(answers, apache_pulsar, dedup, True), 30, "deduplication on")

    producer = cluster_client.create_producer(topic, batching_enabled=False)
    for i in range(20):
        producer.send(f"m{i}".encode())
    producer.close()
    assert values(collect(cluster_client, f"{topic}-out", 20)) == [f"m{i}!" for i in range(20)]


def test_metadata_is_replayed_from_a_topic_the_broker_compacted(
    cluster: Cluster, apache_pulsar: ApachePulsar
) -> None:
    worker = cluster.start_worker("w1")
    inputs = [f"in-{uuid.uuid4().hex[:6]}"]
    for name in ("kept", "updated", "deleted"):
        assert cluster.create(worker, name, inputs=inputs).is_success
    functions = f"{worker.url}/admin/v3/functions/public/default"
    body = {"tenant": "public", "namespace": "default", "name": "updated", "parallelism": 2}
    scaled = httpx.put(
        f"{functions}/updated", data={"functionConfig": json.dumps(body)}, timeout=30
    )
    assert scaled.is_success, scaled.text
    assert httpx.delete(f"{functions}/deleted", timeout=30).is_success

    compaction = f"/admin/v2/persistent/public/{cluster.namespace}/metadata/compaction"
    assert apache_pulsar.admin("PUT", compaction).status_code == 204
    wait_until(
        lambda: apache_pulsar.admin("GET", compaction).json()["status"] == "SUCCESS",
        30,
        "the metadata topic compacted",
    )
    newcomer = cluster.start_worker("w2")
    functions = cluster.get(newcomer, "/admin/v3/functions/public/default")
    assert sorted(functions) == ["kept", "updated"]
    config = cluster.get(newcomer, "/admin/v3/functions/public/default/updated")
    assert config["parallelism"] == 2


@pytest.mark.parametrize(
    ("partitions", "parallelism"), [(0, 1), (PARTITIONS, 2)], ids=["one-topic", "partitioned"]
)
def test_effectively_once_outputs_of_a_killed_instance_are_not_repeated(
    cluster: Cluster,
    apache_pulsar: ApachePulsar,
    cluster_client: pulsar.Client,
    partitions: int,
    parallelism: int,
) -> None:
    """The broker deduplicates what an instance sends again for inputs a killed instance had
    processed but not acknowledged: the one restarted, or the one that took its input
    partitions over (and gives some back when the killed one returns)."""
    worker = cluster.start_worker("w1")
    topic = f"eo-{uuid.uuid4().hex[:6]}"
    if partitions:
        created = apache_pulsar.admin(
            "PUT", f"/admin/v2/persistent/public/default/{topic}/partitions", json=partitions
        )
        assert created.status_code == 204, created.text
    response = cluster.create(
        worker,
        "eo",
        inputs=[topic],
        output=f"{topic}-out",
        processingGuarantees="EFFECTIVELY_ONCE",
        subscriptionPosition="Earliest",
        parallelism=parallelism,
    )
    assert response.is_success, response.text
    wait_until(lambda: running(cluster, worker, "eo") == parallelism, 30, "instances running")
    inputs = [f"e{i}" for i in range(4000)]
    stored: dict[str, object] = {}
    """Input -> its message id, or why its send failed."""

    def stream() -> None:
        producer = cluster_client.create_producer(topic, batching_enabled=False)
        for index, value in enumerate(inputs):  # keys spread the inputs over the partitions
            producer.send_async(
                value.encode(),
                functools.partial(on_stored, value),
                partition_key=f"k{index}",
            )
            time.sleep(0.001)
        producer.flush()
        producer.close()

    def on_stored(value: str, result: pulsar.Result, message_id: pulsar.MessageId) -> None:
        stored[value] = message_id if result == pulsar.Result.Ok else result

    def received() -> int:
        instances = cluster.status(worker, "eo")["instances"]
        return sum(int(i["status"]["numReceived"]) for i in instances)

    streamer = threading.Thread(target=stream)
    streamer.start()
    wait_until(lambda: received() > 500, 30, "processing")
    subprocess.run(["kill", "-9", instance_processes(worker)[0]], check=True)
    streamer.join(60)
    expected = {f"{v}!" for v in inputs}
    outputs = receive_until(cluster_client, f"{topic}-out", expected, timeout=90)
    repeated = {value: n for value, n in Counter(outputs).items() if n > 1}
    missing = sorted(expected - set(outputs), key=lambda value: int(value[1:-1]))
    assert not missing, (
        f"{len(missing)} outputs missing, e.g. {missing[:10]}; their inputs were stored as "
        f"{[str(stored.get(value[:-1], 'never answered')) for value in missing[:10]]}; "
        f"the instances say {cluster.status(worker, 'eo')['instances']}"
    )
    assert not repeated, f"{len(repeated)} outputs sent twice, e.g. {sorted(repeated)[:5]}"
    instances = cluster.status(worker, "eo")["instances"]
    assert sum(int(i["status"]["numRestarts"]) for i in instances) >= 1


def test_instances_consume_every_partition_of_their_input(
    cluster: Cluster, apache_pulsar: ApachePulsar, cluster_client: pulsar.Client
) -> None:
    topic = f"parts-{uuid.uuid4().hex[:6]}"
    created = apache_pulsar.admin(
        "PUT", f"/admin/v2/persistent/public/default/{topic}/partitions", json=PARTITIONS
    )
    assert created.status_code == 204, created.text
    partitions = {f"persistent://public/default/{topic}-partition-{i}" for i in range(PARTITIONS)}
    worker = cluster.start_worker("w1")
    response = cluster.create(
        worker,
        "parts",
        inputs=[topic],
        output=f"{topic}-out",
        parallelism=2,
        subscriptionPosition="Earliest",
    )
    assert response.is_success, response.text
    wait_until(lambda: running(cluster, worker, "parts") == 2, 30, "2 instances running")

    producer = cluster_client.create_producer(topic, batching_enabled=False)
    sent = [f"p{i}" for i in range(60)]
    for index, value in enumerate(sent):  # keys spread the messages over the partitions
        producer.send(value.encode(), partition_key=f"key-{index}")
    producer.close()
    outputs = collect(cluster_client, f"{topic}-out", len(sent))

    assert sorted(values(outputs)) == sorted(f"{v}!" for v in sent)
    assert {m.properties()["__pfn_input_topic__"] for m in outputs} == partitions

    def received() -> int:  # as the instances last reported it
        status = cluster.status(worker, "parts")
        return sum(i["status"]["numReceived"] for i in status["instances"])

    wait_until(lambda: received() == len(sent), 10, "every input counted in the status")


def test_tenants_and_namespaces_are_the_brokers(
    cluster: Cluster, apache_pulsar: ApachePulsar
) -> None:
    worker = cluster.start_worker("w1")
    suffix = uuid.uuid4().hex[:6]

    def call(method: str, path: str, **kwargs: object) -> httpx.Response:
        return httpx.request(method, worker.url + path, timeout=30, **kwargs)  # type: ignore[arg-type]

    assert (
        call("GET", "/admin/v2/tenants").json()
        == apache_pulsar.admin("GET", "/admin/v2/tenants").json()
    )
    tenant = f"t-{suffix}"
    info = {"adminRoles": [], "allowedClusters": call("GET", "/admin/v2/clusters").json()}
    assert call("PUT", f"/admin/v2/tenants/{tenant}", json=info).status_code == 204
    assert apache_pulsar.admin("GET", f"/admin/v2/tenants/{tenant}").status_code == 200
    assert call("PUT", f"/admin/v2/tenants/{tenant}", json=info).status_code == 409
    assert call("PUT", f"/admin/v2/namespaces/{tenant}/ns").status_code == 204
    assert f"{tenant}/ns" in apache_pulsar.admin("GET", f"/admin/v2/namespaces/{tenant}").json()

    code = {"data": ("exclamation.py", (EXAMPLES / "exclamation.py").read_bytes())}
    config = {"className": "exclamation.ExclamationFunction", "inputs": [f"in-{suffix}"]}
    for fqfn, reason in [
        (f"ghost-{suffix}/ns/f", "Tenant does not exist"),
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
