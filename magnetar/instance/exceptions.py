"""Errors of the data plane (function instances and localrun)."""

from magnetar.exceptions import MagnetarError


class InstanceError(MagnetarError):
    """Base class of the instance's errors."""


class InvalidFunctionConfigError(InstanceError):
    """A FunctionConfig that cannot run; the message names the field and why."""


class FunctionLoadError(InstanceError):
    """The function's code could not be loaded (missing file, syntax error, unknown class)."""


class SerDeError(InstanceError):
    """A message could not be (de)serialized, or a SerDe class could not be loaded."""


class StateNotConfiguredError(InstanceError):
    """A state method was called on an instance that has no state store."""


class InvocationTimeoutError(InstanceError):
    """The function ran longer than its ``timeoutMs``."""


class ArchiveLimitError(FunctionLoadError):
    """A code package passes an unpacking limit, or holds an entry that may not be unpacked;
    the message names the limit (the worker setting)."""


class TimerCallbackError(InstanceError):
    """A JavaScript timer callback failed; the message is the script's error."""
