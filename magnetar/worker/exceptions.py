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


class TriggerError(WorkerError):
    """A trigger request cannot be carried out (e.g. the topic is not an input)."""


class TriggerTimeoutError(WorkerError):
    """The triggered function gave no output in time."""


class AuthenticationError(WorkerError):
    """A request carries no valid credentials (HTTP 401)."""


class AuthorizationError(WorkerError):
    """The caller's role may not do what it asked (HTTP 403)."""


class BrokerAdminError(WorkerError):
    """The Apache Pulsar admin API refused a request; the message names the call and reason."""


class BrokerAdminUnreachableError(BrokerAdminError):
    """The Apache Pulsar admin API could not be reached at all (connection, timeout)."""
