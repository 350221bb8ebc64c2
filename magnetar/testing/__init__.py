"""Running Magnetar against the real thing: an Apache Pulsar standalone for tests and
benchmarks (needs Java 17 and the jars ``make apache-pulsar`` fetches)."""

from magnetar.testing.apache_pulsar import (
    CLASSPATH_FILE,
    ApachePulsarError,
    ApachePulsarStandalone,
)

__all__ = ["CLASSPATH_FILE", "ApachePulsarError", "ApachePulsarStandalone"]
