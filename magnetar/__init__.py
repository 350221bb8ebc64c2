"""Magnetar: a Pulsar-native functions worker in Python."""

from magnetar.exceptions import MagnetarError

__version__ = "0.1.0"
__all__ = ["MagnetarError", "__version__"]
