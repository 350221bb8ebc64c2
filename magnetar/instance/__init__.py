"""Data plane: a function instance (consumers -> function -> producer), its Context, SerDe,
code loading (Python, and JavaScript in ``magnetar.instance.javascript``), and localrun."""

from magnetar.instance.config import (
    ConsumerSpec,
    FunctionConfig,
    ProcessingGuarantees,
    Runtime,
    SubscriptionPosition,
    SubscriptionType,
)
from magnetar.instance.context import InstanceContext
from magnetar.instance.exceptions import (
    FunctionLoadError,
    InstanceError,
    InvalidFunctionConfigError,
    SerDeError,
    StateNotConfiguredError,
)
from magnetar.instance.instance import FunctionInstance, InstanceOptions, InvocationTimeoutError
from magnetar.instance.loader import LoadedFunction, load_function
from magnetar.instance.metrics import MetricsSnapshot
from magnetar.instance.secrets import (
    ClearTextSecretsProvider,
    EnvironmentSecretsProvider,
    SecretsProvider,
)
from magnetar.instance.serde import FastIdentitySerDe, load_serde
from magnetar.instance.state import StateStore, UnconfiguredStateStore

__all__ = [
    "ClearTextSecretsProvider",
    "ConsumerSpec",
    "EnvironmentSecretsProvider",
    "FastIdentitySerDe",
    "FunctionConfig",
    "FunctionInstance",
    "FunctionLoadError",
    "InstanceContext",
    "InstanceError",
    "InstanceOptions",
    "InvalidFunctionConfigError",
    "InvocationTimeoutError",
    "LoadedFunction",
    "MetricsSnapshot",
    "ProcessingGuarantees",
    "Runtime",
    "SecretsProvider",
    "SerDeError",
    "StateNotConfiguredError",
    "StateStore",
    "SubscriptionPosition",
    "SubscriptionType",
    "UnconfiguredStateStore",
    "load_function",
    "load_serde",
]
