"""Running Magnetar against the real thing: an Apache Pulsar standalone for tests and
benchmarks (needs Java 17 and the jars ``make apache-pulsar`` fetches)."""

from magnetar.testing.apache_pulsar import CLASSPATH_FILE, ApachePulsarStandalone
from magnetar.testing.exceptions import ApachePulsarError

__all__ = ["CLASSPATH_FILE", "ApachePulsarError", "ApachePulsarStandalone"]
