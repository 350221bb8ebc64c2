"""``docker compose up`` with the repository's docker-compose.yml: the image builds, Pulsar
and three workers become healthy (the image's health check), and a function runs.

It uses the compose file's fixed host ports (6650, 8080-8082, 8090), under a project name of
its own so that it never touches a `magnetar` project the user runs."""

from __future__ import annotations

import json
import uuid

import httpx
import pulsar
import pytest

from tests.conftest import EXAMPLES, ROOT
from tests.docker.conftest import consume, produce, require, texts, wait_until
from tests.docker.container import compose_problem

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]  # the first build takes minutes

WORKERS = {"worker-1": 8080, "worker-2": 8081, "worker-3": 8082}


def test_compose_up_gives_a_working_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    require(compose_problem())
    from testcontainers.compose import DockerCompose

    monkeypatch.setenv("COMPOSE_PROJECT_NAME", f"magnetar-test-{uuid.uuid4().hex[:6]}")
    compose = DockerCompose(ROOT, compose_file_name="docker-compose.yml", build=True, wait=True)
    try:
        compose.start()  # `up --build --wait`: returns once every health check passes
        for service in ("pulsar", *WORKERS):
            assert compose.get_container(service).Health == "healthy", service

        cluster = "http://localhost:8080/admin/v2/worker/cluster"
        wait_until(
            lambda: {w["workerId"] for w in httpx.get(cluster, timeout=10).json()} == set(WORKERS),
            60,
            "the three workers in one cluster",
        )
        retention = httpx.get(
            "http://localhost:8090/admin/v2/namespaces/public/magnetar/retention", timeout=10
        )
        assert retention.json() == {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}

        topic = f"compose-{uuid.uuid4().hex[:6]}"
        body = {
            "tenant": "public",
            "namespace": "default",
            "name": topic,
            "className": "exclamation.ExclamationFunction",
            "inputs": [f"{topic}-in"],
            "output": f"{topic}-out",
            "parallelism": 3,
            "subscriptionPosition": "Earliest",
        }
        created = httpx.post(
            f"http://localhost:8081/admin/v3/functions/public/default/{topic}",
            data={"functionConfig": json.dumps(body)},
            files={"data": ("exclamation.py", (EXAMPLES / "exclamation.py").read_bytes())},
            timeout=60,
        )
        assert created.status_code == 204, created.text
        status_url = f"http://localhost:8082/admin/v3/functions/public/default/{topic}/status"
        wait_until(
            lambda: httpx.get(status_url, timeout=10).json()["numRunning"] == 3,
            90,
            "3 instances running in the containers",
        )

        client = pulsar.Client("pulsar://localhost:6650", operation_timeout_seconds=30)
        try:
            produce(client, f"{topic}-in", [f"c{i}" for i in range(30)])
            outputs = consume(client, f"{topic}-out", lambda got: len(set(texts(got))) >= 30)
        finally:
            client.close()
        assert set(texts(outputs)) == {f"c{i}!" for i in range(30)}
    except Exception:
        stdout, stderr = compose.get_logs()
        print(stdout[-20000:], stderr[-5000:])  # shown by pytest with the failure
        raise
    finally:
        compose.stop()  # `down --volumes`
