"""A cluster of `magnetar worker start` processes on one broker: a pulsar-lite of their own, or
the session's Apache Pulsar (whose admin API the workers are given, as in production)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pulsar
import pytest

from magnetar.broker import EmbeddedBroker
from magnetar.testing import LocalCluster, wait_until
from magnetar.testing import WorkerProcess as Worker
from tests.conftest import EXAMPLES, KEEP_ALIVE_S, Broker, admin_url_of

__all__ = ["Cluster", "Worker", "wait_until"]


class Cluster(LocalCluster):
    """The shared local cluster, creating functions from the examples by file name."""

    def create(  # type: ignore[override]
        self, worker: Worker, name: str, example: str = "exclamation.py", **config: object
    ) -> httpx.Response:
        return super().create(worker, name, EXAMPLES / example, **config)


@pytest.fixture(scope="session")
def cluster_broker(
    broker_kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Broker]:
    """A pulsar-lite of their own for the cluster tests, which kill and pause clients; or the
    session's Apache Pulsar."""
    if broker_kind == "apache":
        yield request.getfixturevalue("apache_pulsar")
        return
    with EmbeddedBroker(
        tmp_path_factory.mktemp("cluster-broker"), keep_alive_s=KEEP_ALIVE_S
    ) as broker:
        yield broker


def worker_env(broker: Broker) -> dict[str, str]:
    """The workers' settings for ``broker``: its admin API where it has one."""
    admin_url = admin_url_of(broker)
    return {"MAGNETAR_PULSAR_ADMIN_URL": admin_url} if admin_url else {}


@pytest.fixture
def cluster(cluster_broker: Broker, tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(cluster_broker.service_url, tmp_path, worker_env(cluster_broker))
    yield running
    running.stop_all()


@pytest.fixture(scope="session")
def cluster_client(cluster_broker: Broker) -> Iterator[pulsar.Client]:
    client = pulsar.Client(
        cluster_broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    yield client
    client.close()
