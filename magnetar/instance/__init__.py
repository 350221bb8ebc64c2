"""Data plane: a function instance (consumers -> function -> producer), its Context, SerDe,
code loading (Python, and JavaScript in ``magnetar.instance.javascript``), and localrun.

Names are imported when first used (PEP 562), so a process that needs one part (a script
check, a tool) does not load them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from magnetar.lazy_exports import lazy_exports

if TYPE_CHECKING:
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

_HOMES = {
    "ConsumerSpec": "magnetar.instance.config",
    "FunctionConfig": "magnetar.instance.config",
    "ProcessingGuarantees": "magnetar.instance.config",
    "Runtime": "magnetar.instance.config",
    "SubscriptionPosition": "magnetar.instance.config",
    "SubscriptionType": "magnetar.instance.config",
    "InstanceContext": "magnetar.instance.context",
    "FunctionLoadError": "magnetar.instance.exceptions",
    "InstanceError": "magnetar.instance.exceptions",
    "InvalidFunctionConfigError": "magnetar.instance.exceptions",
    "SerDeError": "magnetar.instance.exceptions",
    "StateNotConfiguredError": "magnetar.instance.exceptions",
    "FunctionInstance": "magnetar.instance.instance",
    "InstanceOptions": "magnetar.instance.instance",
    "InvocationTimeoutError": "magnetar.instance.instance",
    "LoadedFunction": "magnetar.instance.loader",
    "load_function": "magnetar.instance.loader",
    "MetricsSnapshot": "magnetar.instance.metrics",
    "ClearTextSecretsProvider": "magnetar.instance.secrets",
    "EnvironmentSecretsProvider": "magnetar.instance.secrets",
    "SecretsProvider": "magnetar.instance.secrets",
    "FastIdentitySerDe": "magnetar.instance.serde",
    "load_serde": "magnetar.instance.serde",
    "StateStore": "magnetar.instance.state",
    "UnconfiguredStateStore": "magnetar.instance.state",
}


__getattr__ = lazy_exports(globals(), _HOMES)
