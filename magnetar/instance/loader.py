"""Loading a Python function from ``--py`` (a .py file or a .zip) and ``--classname``.

The class name is resolved as Apache Pulsar's Python instance resolves it:

* ``module`` (no dot): the module of that name, whose ``process(input)`` is called for each
  message (Apache imports the name as a module and calls its ``process``);
* ``module.Class`` or ``package.module.Class``: the class, instantiated once, whose
  ``process(input, context)`` is called;
* ``package.module``: that module's ``process(input)``.

Beyond Apache: ``module.function`` calls that function; a name without a dot that is not a
module names a class or function in the module the ``.py`` file defines; without a class
name the module's only ``pulsar.Function`` subclass, or else its ``process``, runs; and a
``process`` may take the context or not, whatever its form. A zip holds the module at its
root, under ``src/`` or under a single top-level folder (the layout ``pulsar-admin`` builds).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from magnetar.instance.archive import ArchiveLimits
from magnetar.instance.code_modules import modules_of, own_modules
from magnetar.instance.code_package import code_search_paths
from magnetar.instance.exceptions import FunctionLoadError

__all__ = ["LoadedFunction", "code_search_paths", "load_attribute", "load_function"]


@dataclass(frozen=True)
class LoadedFunction:
    """The user's function, ready to call."""

    process: Callable[..., Any]
    """The callable invoked for every message."""
    takes_context: bool
    """Whether ``process`` is called as ``process(input, context)`` or ``process(input)``."""
    name: str
    """The class or function name (the default function name)."""
    search_paths: list[Path]
    """Where the function's modules live (also searched for SerDe classes)."""
    modules: Mapping[str, ModuleType] = field(default_factory=dict)
    """The modules imported from its code when it was loaded, by name (see
    ``code_modules``: in a process shared with other functions, ``sys.modules`` may hold
    another function's module of the same name later)."""


def _module_name(py: str | Path) -> str:
    return Path(py).stem


def load_function(
    py: str | Path,
    class_name: str | None,
    work_dir: Path | None = None,
    limits: ArchiveLimits | None = None,
) -> LoadedFunction:
    """Import the function named by ``class_name`` from the code in ``py`` (see the module
    docstring for the forms of ``class_name``), a package unpacked within ``limits``."""
    search_paths = code_search_paths(py, work_dir, limits)
    if class_name and "." in class_name:
        target = load_attribute(class_name, search_paths)
        name = class_name.rsplit(".", 1)[1]
    elif class_name and _is_module_in(class_name, search_paths):
        target = _import(class_name, search_paths)
        name = class_name
    else:
        module = _import(_module_name(py), search_paths)
        name = class_name or _default_entry_point(module)
        if not hasattr(module, name):
            raise FunctionLoadError(
                f"no module named {name!r} next to {Path(py).name}, and module "
                f"{module.__name__!r} has no class or function {name!r}; it defines: "
                f"{', '.join(_public_names(module)) or 'nothing public'}"
            )
        target = getattr(module, name)
    return _as_function(target, name, search_paths)


def _is_module_in(name: str, search_paths: list[Path]) -> bool:
    """Whether ``name`` is a module of the function's own code (not one installed)."""
    return (
        importlib.machinery.PathFinder.find_spec(name, [str(p) for p in search_paths]) is not None
    )


def load_attribute(dotted: str, search_paths: list[Path]) -> Any:
    """``package.module.Name`` -> the object (a module too), importing from
    ``search_paths`` first."""
    module_name, _, attribute = dotted.rpartition(".")
    if not module_name:
        raise FunctionLoadError(f"{dotted!r} must be a dotted name such as module.ClassName")
    module = _import(module_name, search_paths)
    try:
        return getattr(module, attribute)
    except AttributeError:
        pass
    if hasattr(module, "__path__") and importlib.util.find_spec(dotted) is not None:
        return _import(dotted, search_paths)  # package.module: the submodule itself
    raise FunctionLoadError(
        f"module {module_name!r} has no class or function {attribute!r}; it defines: "
        f"{', '.join(_public_names(module)) or 'nothing public'}"
    )


def _import(module_name: str, search_paths: list[Path]) -> Any:
    try:
        with own_modules(search_paths):
            return importlib.import_module(module_name)
    except SyntaxError as error:
        raise FunctionLoadError(
            f"syntax error in {error.filename}, line {error.lineno}, column {error.offset}: "
            f"{error.msg}\n    {(error.text or '').rstrip()}"
        ) from None
    except ModuleNotFoundError as error:
        if error.name == module_name:
            where = ", ".join(str(p) for p in search_paths)
            raise FunctionLoadError(f"no module named {module_name!r} in {where}") from None
        raise FunctionLoadError(
            f"importing {module_name!r} failed: {error} (is the dependency installed, or "
            "packaged in the function's zip?)"
        ) from None
    except Exception as error:
        raise FunctionLoadError(
            f"importing {module_name!r} failed: {type(error).__name__}: {error}"
        ) from None


def _public_names(module: Any) -> list[str]:
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", None) == module.__name__
    )


def _default_entry_point(module: Any) -> str:
    import pulsar

    classes = [
        name
        for name, value in vars(module).items()
        if inspect.isclass(value)
        and issubclass(value, pulsar.Function)
        and value is not pulsar.Function
        and value.__module__ == module.__name__
    ]
    if len(classes) == 1:
        return str(classes[0])
    if callable(getattr(module, "process", None)):
        return "process"
    raise FunctionLoadError(
        f"cannot tell which function to run in module {module.__name__!r}: "
        "pass --classname (module.ClassName or module.function)"
    )


def _as_function(target: Any, name: str, search_paths: list[Path]) -> LoadedFunction:
    if inspect.ismodule(target):
        process = getattr(target, "process", None)
        if not callable(process):
            raise FunctionLoadError(
                f"module {name!r} has no process function: define def process(input) in it, "
                "or name a class with --classname module.ClassName"
            )
    elif inspect.isclass(target):
        if not callable(getattr(target, "process", None)):
            raise FunctionLoadError(f"class {name!r} has no process(self, input, context) method")
        try:
            instance: Any = target()
        except Exception as error:
            raise FunctionLoadError(
                f"creating an instance of {name!r} failed: {type(error).__name__}: {error}"
            ) from None
        process = instance.process
    elif callable(target):
        process = target
    else:
        raise FunctionLoadError(f"{name!r} is neither a class, a module nor a function")
    return LoadedFunction(
        process, _takes_context(process, name), name, search_paths, modules_of(search_paths)
    )


def _takes_context(process: Callable[..., Any], name: str) -> bool:
    """Whether ``process`` is called with the context: it must take the input, and may take
    the context after it; more required parameters cannot be given."""
    try:
        parameters = list(inspect.signature(process).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    required_keywords = [
        p.name for p in parameters if p.kind is p.KEYWORD_ONLY and p.default is p.empty
    ]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in parameters)
    if len(required) > 2 or required_keywords:
        extra = [p.name for p in required[2:]] + required_keywords
        raise FunctionLoadError(
            f"the process of {name!r} has too many parameters: it is called as "
            f"process(input) or process(input, context), so {', '.join(extra)} would have "
            "no value"
        )
    if variadic or len(positional) >= 2:
        return True
    if len(positional) == 1:
        return False
    raise FunctionLoadError(
        f"the process of {name!r} takes no input: write process(input) or "
        "process(self, input, context)"
    )
