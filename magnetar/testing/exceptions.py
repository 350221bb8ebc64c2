"""The errors of :mod:`magnetar.testing`."""

from magnetar.exceptions import MagnetarError

__all__ = ["ApachePulsarError"]


class ApachePulsarError(MagnetarError):
    """Apache Pulsar standalone could not be started: Java or its jars are missing, or it
    failed (its log says why)."""
