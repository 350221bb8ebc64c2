"""Secrets providers, as in Apache Pulsar's Python instance.

A function declares the secrets it uses in its config (``secrets``: name -> locator);
``context.get_secret(name)`` returns None for an undeclared name and otherwise asks the
provider for the secret at that locator. The default provider is Apache's default,
``ClearTextSecretsProvider``: the locator is the secret. ``--secrets-provider-classname``
picks another by Apache's names (``secretsprovider.EnvironmentBasedSecretsProvider`` reads
the environment variable named like the secret) or a class of your own
(``module.ClassName`` with ``provide_secret(secret_name, path_to_secret)`` and, optionally,
``init(config)``, given ``--secrets-provider-config``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from magnetar.instance.exceptions import FunctionLoadError

__all__ = [
    "ClearTextSecretsProvider",
    "EnvironmentSecretsProvider",
    "SecretsProvider",
    "load_secrets_provider",
]


class SecretsProvider(Protocol):
    def provide_secret(self, secret_name: str, path_to_secret: Any) -> Any: ...


class ClearTextSecretsProvider:
    """The default: the locator in the config is the secret itself."""

    def init(self, config: Any) -> None:
        """Nothing to set up."""

    def provide_secret(self, secret_name: str, path_to_secret: Any) -> Any:
        return path_to_secret


class EnvironmentSecretsProvider:
    """The secret is the environment variable named like the secret."""

    def init(self, config: Any) -> None:
        """Nothing to set up."""

    def provide_secret(self, secret_name: str, path_to_secret: Any) -> str | None:
        return os.environ.get(secret_name)


_BUILT_IN: dict[str, type[SecretsProvider]] = {}
for _prefix in ("secretsprovider.", "org.apache.pulsar.functions.secretsprovider.", ""):
    _BUILT_IN[f"{_prefix}ClearTextSecretsProvider"] = ClearTextSecretsProvider
    _BUILT_IN[f"{_prefix}EnvironmentBasedSecretsProvider"] = EnvironmentSecretsProvider


def load_secrets_provider(
    class_name: str | None, config: Any = None, search_paths: list[Path] | None = None
) -> SecretsProvider:
    """The provider ``class_name`` names (the default one for None), initialized with
    ``config`` as Apache's instance does."""
    if not class_name:
        return ClearTextSecretsProvider()
    kind = _BUILT_IN.get(class_name)
    if kind is None:
        from magnetar.instance.loader import load_attribute

        try:
            kind = load_attribute(class_name, search_paths or [])
        except FunctionLoadError as error:
            raise FunctionLoadError(f"cannot load the secrets provider: {error}") from None
        if not callable(getattr(kind, "provide_secret", None)):
            raise FunctionLoadError(
                f"secrets provider {class_name!r} has no provide_secret(secret_name, "
                "path_to_secret) method"
            )
    try:
        provider = kind()
        init = getattr(provider, "init", None)
        if callable(init):
            init(config)
    except Exception as error:
        raise FunctionLoadError(
            f"creating the secrets provider {class_name!r} failed: {type(error).__name__}: {error}"
        ) from None
    return provider
