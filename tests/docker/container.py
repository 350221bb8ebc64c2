"""Apache Pulsar from the ``apachepulsar/pulsar`` image (testcontainers), for machines with a
Docker engine: ``pytest --apache-pulsar docker`` (``make test-docker``) runs the Apache Pulsar
suites against it instead of the standalone Maven fetched.

Standalone Pulsar advertising a loopback address answers lookups with "connect through the
URL you dialled", so the container's mapped ports work from the host.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

PULSAR_IMAGE = os.environ.get("PULSAR_IMAGE", "apachepulsar/pulsar:4.0.7")
"""The Apache Pulsar image (the release apache-pulsar/pom.xml pins, by default)."""
STANDALONE = (
    "bin/pulsar standalone --no-functions-worker --no-stream-storage --advertised-address localhost"
)
_STARTUP_TIMEOUT_S = 240.0


def docker_problem() -> str | None:
    """Why no Docker engine can be used here, or None when one answers a ping."""
    try:
        import docker

        client = docker.from_env(timeout=5)
    except Exception as error:  # the SDK raises DockerException, or OSError, or ...
        return f"no Docker engine is reachable ({error})"
    try:
        client.ping()
    except Exception as error:
        return f"the Docker engine does not answer a ping ({error})"
    finally:
        client.close()
    return None


def compose_problem() -> str | None:
    """Why ``docker compose`` cannot be run here, or None."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    result = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        return f"the docker compose plugin is not installed ({result.stderr.strip()})"
    return None


@dataclass(frozen=True)
class DockerPulsar:
    """The container's broker as the host reaches it."""

    service_url: str
    """``pulsar://host:port`` (the mapped 6650)."""
    admin_url: str
    """``http://host:port`` (the mapped 8080)."""

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, self.admin_url + path, timeout=30, **kwargs)


@contextmanager
def pulsar_container() -> Iterator[DockerPulsar]:
    """Apache Pulsar standalone in a container; the run fails, naming why, without an engine."""
    problem = docker_problem()
    if problem is not None:
        pytest.fail(f"--apache-pulsar docker: {problem}", pytrace=False)
    from testcontainers.core.container import DockerContainer

    container = (
        DockerContainer(PULSAR_IMAGE, command=STANDALONE)
        .with_env("PULSAR_MEM", "-Xms512m -Xmx1g -XX:MaxDirectMemorySize=1g")
        .with_exposed_ports(6650, 8080)
    )
    container.start()
    try:
        host = container.get_container_host_ip()
        broker = DockerPulsar(
            f"pulsar://{host}:{container.get_exposed_port(6650)}",
            f"http://{host}:{container.get_exposed_port(8080)}",
        )
        _wait_until_serving(broker, container)
        yield broker
    finally:
        container.stop()


def _wait_until_serving(broker: DockerPulsar, container: Any) -> None:
    """Until the broker passes its own health check (a produce and consume) and has
    created public/default."""
    deadline = time.monotonic() + _STARTUP_TIMEOUT_S
    last = "no answer yet"
    while time.monotonic() < deadline:
        try:
            health = broker.admin("GET", "/admin/v2/brokers/health")
            namespaces = broker.admin("GET", "/admin/v2/namespaces/public")
            if health.status_code == 200 and "public/default" in namespaces.text:
                return
            last = f"health {health.status_code} {health.text[:100]!r}"
        except httpx.HTTPError as error:
            last = f"{type(error).__name__}: {error}"
        time.sleep(1)
    logs = container.get_wrapped_container().logs(tail=200).decode(errors="replace")
    raise AssertionError(
        f"{PULSAR_IMAGE} did not serve within {_STARTUP_TIMEOUT_S:.0f} s ({last}):\n{logs}"
    )
