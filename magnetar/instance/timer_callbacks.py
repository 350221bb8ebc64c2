"""A Python function's timer callbacks: stored by name (a timer outlives the process that
armed it), found again by that name when the timer fires.

A callback is a method of the function's object (``method:<name>``) or a function of a
module (``<module>:<name>``), called as ``callback(payload, context)``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from magnetar.instance.loader import LoadedFunction

__all__ = ["PythonCallbacks", "uses_timers"]

_METHOD = "method:"


class PythonCallbacks:
    """Names and finds the timer callbacks of one loaded function."""

    def __init__(self, function: LoadedFunction) -> None:
        self._owner = getattr(function.process, "__self__", None)
        self._modules = function.modules

    def name(self, callback: Any) -> str:
        """The name a timer stores for ``callback``; TypeError for one it could not find
        again."""
        if inspect.ismethod(callback) and self._owner is not None:
            if callback.__self__ is self._owner:
                return _METHOD + callback.__name__
        elif inspect.isfunction(callback) and "." not in callback.__qualname__:
            return f"{callback.__module__}:{callback.__name__}"
        raise TypeError(
            f"a timer's callback must be a method of the function's class or a function "
            f"defined at the top level of a module, got {callback!r}"
        )

    def find(self, name: str) -> Callable[..., Any]:
        """The callback named ``name``; LookupError when the code no longer has it."""
        if name.startswith(_METHOD):
            attribute = name[len(_METHOD) :]
            found = getattr(self._owner, attribute, None)
        else:
            module, _, attribute = name.partition(":")
            try:
                # the function's own module first: another function in this process may
                # have one of the same name
                home = self._modules.get(module) or importlib.import_module(module)
                found = getattr(home, attribute, None)
            except ImportError:
                found = None
        if not callable(found):
            raise LookupError(f"the timer callback {name!r} is not in the function's code")
        callback: Callable[..., Any] = found
        return callback


def uses_timers(function: LoadedFunction) -> bool:
    """Whether the function's code can arm timers (it names ``create_timer``): then its
    instances read their state table at start, so timers due while no input comes fire."""
    module = inspect.getmodule(getattr(function.process, "__func__", function.process))
    try:
        source = inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        return True  # cannot tell: materializing costs time, missing a timer costs more
    return "create_timer" in source
