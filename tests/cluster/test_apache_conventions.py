"""Every convention of Apache Pulsar's Python examples registered over the REST API on a
3-worker cluster, unchanged, with the output Apache gives."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pulsar

from tests.cluster.conftest import Cluster, wait_until
from tests.conventions import CONVENTIONS, check_all
from tests.integration.conftest import produce


def test_every_apache_convention_runs_unchanged_on_a_cluster(
    cluster: Cluster, cluster_client: pulsar.Client, tmp_path: Path
) -> None:
    workers = cluster.start(3)
    prefix = f"rest{uuid.uuid4().hex[:6]}"
    for index, convention in enumerate(CONVENTIONS):
        package = convention.package(tmp_path)
        response = httpx.post(
            f"{workers[index % 3].url}/admin/v3/functions/public/default/{convention.name}",
            data={"functionConfig": json.dumps(convention.function_config(prefix))},
            files={"data": (package.name, package.read_bytes())},
            timeout=30,
        )
        assert response.status_code == 204, f"{convention.name}: {response.text}"
    for convention in CONVENTIONS:
        wait_until(
            lambda name=convention.name: cluster.status(workers[0], name)["numRunning"] == 1,
            60,
            f"{convention.name} running",
        )
        produce(cluster_client, convention.topics(prefix)["in"], convention.inputs)
    assert check_all(cluster_client, prefix, timeout_s=90) == {}
    status = cluster.status(workers[1], "raises")["instances"][0]["status"]
    assert status["numUserExceptions"] == 2 and status["numDeadLettered"] == 1
