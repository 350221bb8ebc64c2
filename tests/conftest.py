"""Shared fixtures: the brokers a test runs on, clients, unique topics.

Every test that uses a broker runs on the embedded pulsar-lite; a test (or module) marked
``@pytest.mark.brokers("lite", "apache")`` runs on Apache Pulsar as well, and one marked
``brokers("apache")`` on Apache Pulsar alone. ``--brokers lite`` (or ``apache``) narrows a run
to one of them. Apache Pulsar is one standalone for the whole run, from the jars
``make apache-pulsar`` fetched (``--apache-pulsar docker``: the ``apachepulsar/pulsar`` image).
"""

from __future__ import annotations

import faulthandler
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import pulsar
import pytest

from magnetar.broker import EmbeddedBroker
from magnetar.testing import ApachePulsarError, ApachePulsarStandalone
from magnetar.worker.instance_network import remove_table, table_exists

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

BROKERS = ("lite", "apache")
"""What ``--brokers`` chooses from: pulsar-lite (embedded) and Apache Pulsar."""
KEEP_ALIVE_S = 2
"""How often a broker pings its clients: a paused or vanished one is found within ~2x this."""
HUNG_TEST_S = 900
"""A test (its fixtures included) still running after this is hung: every thread's stack is
printed and the run ends, instead of waiting out CI's limit."""


class Broker(Protocol):
    """What tests need of a broker, embedded or Apache Pulsar."""

    @property
    def service_url(self) -> str: ...


class ApachePulsar(Protocol):
    """An Apache Pulsar broker with its admin API (standalone or in a container)."""

    @property
    def service_url(self) -> str: ...

    @property
    def admin_url(self) -> str: ...

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...


def admin_url_of(broker: Broker) -> str | None:
    """The admin API of ``broker``: None for pulsar-lite, which has none."""
    url = getattr(broker, "admin_url", None)
    return str(url) if url is not None else None


# --- which brokers a test runs on ------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("magnetar")
    group.addoption(
        "--brokers",
        default=",".join(BROKERS),
        help="the brokers to run on, comma-separated: lite (embedded pulsar-lite), apache "
        "(Apache Pulsar standalone); default: both",
    )
    group.addoption(
        "--apache-pulsar",
        default="maven",
        metavar="maven|docker|SERVICE_URL,ADMIN_URL",
        help="where Apache Pulsar comes from: the jars `make apache-pulsar` fetched (default), "
        "the apachepulsar/pulsar image on a Docker engine, or a running broker",
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    """Which Apache Pulsar release the Apache suites run on (with ``--apache-pulsar maven``)."""
    if "apache" not in _chosen_brokers(config) or config.getoption("apache_pulsar") != "maven":
        return None
    from magnetar.testing import CLASSPATH_FILE

    jars = CLASSPATH_FILE.read_text().split(":") if CLASSPATH_FILE.is_file() else []
    names = (Path(jar).name for jar in jars)
    broker = next((n for n in names if n.startswith("pulsar-broker-") and n[14:15].isdigit()), "")
    release = broker.removeprefix("pulsar-broker-").removesuffix(".jar")
    return f"Apache Pulsar: {release or 'not resolved (run make apache-pulsar)'} (Maven Central)"


def pytest_configure(config: pytest.Config) -> None:
    chosen = _chosen_brokers(config)
    unknown = chosen - set(BROKERS)
    if unknown or not chosen:
        raise pytest.UsageError(
            f"--brokers {config.getoption('brokers')!r}: choose from {', '.join(BROKERS)}"
        )
    source = str(config.getoption("apache_pulsar"))
    if source not in ("maven", "docker") and not _running_broker(source):
        raise pytest.UsageError(
            f"--apache-pulsar {source!r}: give maven, docker, or the service and admin URLs of a "
            "running broker, e.g. pulsar://127.0.0.1:6650,http://127.0.0.1:8080"
        )


@dataclass(frozen=True)
class RunningPulsar:
    """An Apache Pulsar broker that runs already (``--apache-pulsar URL,URL``)."""

    service_url: str
    admin_url: str

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, self.admin_url + path, timeout=30, **kwargs)


def _running_broker(source: str) -> RunningPulsar | None:
    service_url, _, admin_url = source.partition(",")
    if service_url.startswith("pulsar://") and admin_url.startswith("http"):
        return RunningPulsar(service_url, admin_url.rstrip("/"))
    return None


def _chosen_brokers(config: pytest.Config) -> set[str]:
    return {name.strip() for name in str(config.getoption("brokers")).split(",") if name.strip()}


def _brokers_of(node: pytest.Item | Any) -> tuple[str, ...]:
    marker = node.get_closest_marker("brokers")
    return tuple(marker.args) if marker is not None else ("lite",)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    # pytest-timeout's signal never fires while the main thread waits inside native code (a
    # client call that does not return, a GIL deadlock): faulthandler's timer is a C thread.
    faulthandler.dump_traceback_later(HUNG_TEST_S, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run a test that uses a broker once per broker it is marked for (and chosen)."""
    if "broker_kind" not in metafunc.fixturenames:
        return
    marked = _brokers_of(metafunc.definition)
    chosen = [kind for kind in marked if kind in _chosen_brokers(metafunc.config)]
    # A test none of whose brokers is chosen is deselected after collection.
    metafunc.parametrize("broker_kind", chosen or marked[:1], indirect=True, scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    chosen = _chosen_brokers(config)
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        kind = callspec.params.get("broker_kind") if callspec is not None else None
        runs_on = {kind} if kind is not None else set(_brokers_of(item))
        (keep if runs_on & chosen else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session", autouse=True)
def _instance_network_rules() -> Iterator[None]:
    """Root workers the tests start write the host's rules for instance uids
    (``magnetar.worker.instance_network``): rules the run made go with it."""
    made_here = not table_exists()
    yield
    if made_here:
        remove_table()


@pytest.fixture(scope="session")
def broker_kind(request: pytest.FixtureRequest) -> str:
    """``lite`` or ``apache``: the broker this test runs on."""
    return str(getattr(request, "param", "lite"))


# --- the brokers ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def apache_pulsar(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApachePulsar]:
    """Apache Pulsar, started once for the run when the first test needs it."""
    source = str(request.config.getoption("apache_pulsar"))
    if source == "docker":
        from tests.docker.container import pulsar_container

        with pulsar_container() as container:
            yield container
        return
    running = _running_broker(source)
    if running is not None:
        yield running
        return
    standalone = ApachePulsarStandalone(
        tmp_path_factory.mktemp("apache-pulsar"), keep_alive_s=KEEP_ALIVE_S, quick_start=True
    )
    try:
        standalone.start()
    except ApachePulsarError as error:
        pytest.fail(f"{error}\n(`pytest --brokers lite` runs without it)", pytrace=False)
    try:
        yield standalone
    finally:
        standalone.stop()


@pytest.fixture(scope="session")
def broker(
    broker_kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Broker]:
    """The broker of this test: the embedded one on a free loopback port with a temporary
    data directory, or the session's Apache Pulsar."""
    if broker_kind == "apache":
        yield request.getfixturevalue("apache_pulsar")
        return
    with EmbeddedBroker(tmp_path_factory.mktemp("broker")) as running:
        yield running


@pytest.fixture(scope="session")
def broker_url(broker: Broker) -> str:
    return broker.service_url


@pytest.fixture(scope="session")
def admin_url(broker: Broker) -> str | None:
    """The broker's admin API (``--pulsar-admin-url``), None on pulsar-lite."""
    return admin_url_of(broker)


@pytest.fixture(scope="session")
def client(broker_url: str) -> Iterator[pulsar.Client]:
    """A pulsar-client connected to the session broker (quiet unless something is wrong)."""
    c = pulsar.Client(
        broker_url,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        operation_timeout_seconds=10,
    )
    yield c
    c.close()


@pytest.fixture
def topic() -> str:
    """A fresh topic name; each call site adds a suffix for more topics."""
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def cli_env(broker_url: str) -> dict[str, str]:
    """Environment for running the `magnetar` CLI in a subprocess against the broker."""
    env = dict(os.environ)
    env["MAGNETAR_BROKER_URL"] = broker_url
    env["PYTHONUNBUFFERED"] = "1"
    return env


MAGNETAR = [sys.executable, "-m", "magnetar.cli"]


def instance_pids(parent: int) -> list[int]:
    """The instance processes a localrun (process ``parent``) started."""
    children = subprocess.run(
        ["pgrep", "-P", str(parent)], capture_output=True, text=True, check=False
    ).stdout.split()
    return [
        int(pid) for pid in children if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()
    ]
