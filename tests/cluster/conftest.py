"""A cluster of `magnetar worker start` processes on one broker: a pulsar-lite of their own, or
the session's Apache Pulsar (whose admin API the workers are given, as in production)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pulsar
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from magnetar.broker import EmbeddedBroker
from magnetar.testing import LocalCluster, wait_until
from magnetar.testing import WorkerProcess as Worker
from tests.conftest import EXAMPLES, KEEP_ALIVE_S, Broker, admin_url_of

__all__ = ["Cluster", "ConsolePages", "Worker", "wait_until"]


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


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless chromium, the system's (``MAGNETAR_CHROMIUM`` names another): Playwright is
    given the browser, it downloads none. The only reason a console test skips is that there
    is none. One per module: Playwright's event loop lives no longer than the tests that drive
    it."""
    path = os.environ.get("MAGNETAR_CHROMIUM") or shutil.which("chromium")
    if path is None:
        pytest.skip(
            "no browser installed: the console's tests need Debian's chromium "
            "(apt-get install chromium; `make test` installs it when run as root)"
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=path)
        yield launched
        launched.close()


class ConsolePages:
    """Opens pages of a worker's console; fails the test on any error of the page's script."""

    def __init__(self, browser: Browser) -> None:
        self.browser = browser
        self.pages: list[Page] = []
        self.script_errors: list[str] = []

    def open(self, worker: Worker, route: str = "") -> Page:
        """A new page on ``worker``'s console (``route``: ``#/functions/...``)."""
        page = self.browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(30_000)
        page.on("pageerror", lambda error: self.script_errors.append(str(error)))
        page.goto(f"{worker.url}/console/{route}")
        self.pages.append(page)
        return page


@pytest.fixture
def console(browser: Browser) -> Iterator[ConsolePages]:
    pages = ConsolePages(browser)
    yield pages
    for page in pages.pages:
        page.close()
    assert not pages.script_errors, f"the console's script failed: {pages.script_errors}"
