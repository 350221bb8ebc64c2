"""A cluster of `magnetar worker start` processes on one pulsar-lite broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pulsar
import pytest

from magnetar.broker import EmbeddedBroker
from magnetar.testing import LocalCluster, wait_until
from magnetar.testing import WorkerProcess as Worker
from tests.conftest import EXAMPLES

__all__ = ["Cluster", "Worker", "wait_until"]


class Cluster(LocalCluster):
    """The shared local cluster, creating functions from the examples by file name."""

    def create(  # type: ignore[override]
        self, worker: Worker, name: str, example: str = "exclamation.py", **config: object
    ) -> httpx.Response:
        return super().create(worker, name, EXAMPLES / example, **config)


@pytest.fixture(scope="session")
def cluster_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A broker of their own for the cluster tests, which kill and pause clients."""
    with EmbeddedBroker(tmp_path_factory.mktemp("cluster-broker"), keep_alive_s=2) as broker:
        yield broker


@pytest.fixture
def cluster(cluster_broker: EmbeddedBroker, tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(cluster_broker.service_url, tmp_path)
    yield running
    running.stop_all()


@pytest.fixture(scope="session")
def cluster_client(cluster_broker: EmbeddedBroker) -> Iterator[pulsar.Client]:
    client = pulsar.Client(
        cluster_broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    yield client
    client.close()
