"""Errors of the worker (control plane)."""

from magnetar.exceptions import MagnetarError


class WorkerError(MagnetarError):
    """Base class of the worker's errors."""


class WorkerConfigError(WorkerError):
    """The worker's configuration is invalid; the message names the setting."""


class ForeignSystemTopicError(WorkerConfigError):
    """A system topic holds records that another kind of functions worker wrote."""


class NotLeaderError(WorkerError):
    """This worker is not (or no longer) the leader; retry on the leader."""


class LeaderUnavailableError(WorkerError):
    """No leader is known yet (the cluster is starting or electing one)."""


class RequestRefusedError(WorkerError):
    """A request refused as Apache Pulsar refuses it: the HTTP status and the reason it gives.

    Subclasses name the common causes and their usual status; a call site passes another
    status where Pulsar answers the same cause differently (an update of a missing function
    is 400, a delete of one 404)."""

    status_code = 400

    def __init__(self, reason: str, status_code: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        if status_code is not None:
            self.status_code = status_code


class FunctionExistsError(RequestRefusedError):
    """A function with that name is already registered (400, as in Pulsar)."""


class FunctionNotFoundError(RequestRefusedError):
    """No function with that name is registered (404, or 400 where Pulsar says so)."""

    status_code = 404


class TenantNotFoundError(RequestRefusedError):
    """No tenant with that name exists."""

    status_code = 404


class NamespaceNotFoundError(RequestRefusedError):
    """No namespace with that name exists."""

    status_code = 404


class AlreadyExistsError(RequestRefusedError):
    """The tenant or namespace to create exists already (409)."""

    status_code = 409


class NotEmptyError(RequestRefusedError):
    """The tenant or namespace to delete still holds namespaces or functions (409)."""

    status_code = 409


class PreconditionFailedError(RequestRefusedError):
    """A name or a cluster list Pulsar would not accept (412)."""

    status_code = 412


class AdmissionError(RequestRefusedError):
    """A function, a change or a package that is invalid or past a limit (400); the reason
    names the rule or the limit (the worker setting)."""


class PackageError(WorkerError):
    """A code package could not be stored or fetched; the message names the package."""


class ReplicationTimeoutError(WorkerError):
    """A write was accepted but this worker did not see it applied in time."""


class TriggerError(RequestRefusedError):
    """A trigger request cannot be carried out (e.g. the topic is not an input)."""


class TriggerTimeoutError(RequestRefusedError):
    """The triggered function gave no output in time (408)."""

    status_code = 408


class AuthenticationError(WorkerError):
    """A request carries no valid credentials (HTTP 401)."""


class AuthorizationError(WorkerError):
    """The caller's role may not do what it asked (HTTP 403)."""


class BrokerAdminError(WorkerError):
    """The Apache Pulsar admin API refused a request; the message names the call and reason."""


class BrokerAdminUnreachableError(BrokerAdminError):
    """The Apache Pulsar admin API could not be reached at all (connection, timeout)."""
