"""A package's names imported when first used (PEP 562): importing one submodule of the package
(a script check importing V8, a tool importing a config) does not load all the others."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(namespace: dict[str, Any], homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's ``__getattr__``: a name of ``homes`` (name -> module) is imported from its
    module when first asked for and kept in ``namespace`` (the package's globals)."""

    def get(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name]), name)
        namespace[name] = value
        return value

    return get
