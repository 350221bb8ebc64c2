"""Errors of the worker (control plane)."""

from magnetar.exceptions import MagnetarError


class WorkerError(MagnetarError):
    """Base class of the worker's errors."""


class WorkerConfigError(WorkerError):
    """The worker's configuration is invalid; the message names the setting."""


class NotLeaderError(WorkerError):
    """This worker is not (or no longer) the leader; retry on the leader."""


class LeaderUnavailableError(WorkerError):
    """No leader is known yet (the cluster is starting or electing one)."""


class FunctionExistsError(WorkerError):
    """A function with that name is already registered."""


class FunctionNotFoundError(WorkerError):
    """No function with that name is registered."""


class PackageError(WorkerError):
    """A code package could not be stored or fetched; the message names the package."""


class ReplicationTimeoutError(WorkerError):
    """A write was accepted but this worker did not see it applied in time."""
