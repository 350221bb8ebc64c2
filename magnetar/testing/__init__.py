"""Running and testing Magnetar: an Apache Pulsar standalone for tests and benchmarks and
Apache Pulsar's own pulsar-admin (both need Java 17 and the jars ``make apache-pulsar``
fetches), and a local cluster of worker processes."""

from magnetar.testing.apache_pulsar import (
    CLASSPATH_FILE,
    ApachePulsarStandalone,
    TokenAuthorization,
)
from magnetar.testing.cluster import LocalCluster, WorkerProcess, wait_until
from magnetar.testing.exceptions import ApachePulsarError
from magnetar.testing.processes import descendants_named
from magnetar.testing.pulsar_admin import PULSAR_ADMIN_CLASSPATH_FILE, AdminShell, PulsarAdmin

__all__ = [
    "CLASSPATH_FILE",
    "PULSAR_ADMIN_CLASSPATH_FILE",
    "AdminShell",
    "ApachePulsarError",
    "ApachePulsarStandalone",
    "LocalCluster",
    "PulsarAdmin",
    "TokenAuthorization",
    "WorkerProcess",
    "descendants_named",
    "wait_until",
]
