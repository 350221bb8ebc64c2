"""Secrets providers, as in Apache Pulsar's Python instance.

A function declares the secrets it uses in its config (``secrets``: name -> locator);
``context.get_secret(name)`` returns None for an undeclared name and otherwise asks the
provider.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

__all__ = ["ClearTextSecretsProvider", "EnvironmentSecretsProvider", "SecretsProvider"]


class SecretsProvider(Protocol):
    def provide_secret(self, secret_name: str, path_to_secret: Any) -> str | None: ...


class EnvironmentSecretsProvider:
    """The default: the secret is the environment variable named like the secret."""

    def provide_secret(self, secret_name: str, path_to_secret: Any) -> str | None:
        return os.environ.get(secret_name)


class ClearTextSecretsProvider:
    """The locator in the config is the secret itself (for tests and local runs)."""

    def provide_secret(self, secret_name: str, path_to_secret: Any) -> str | None:
        return None if path_to_secret is None else str(path_to_secret)
