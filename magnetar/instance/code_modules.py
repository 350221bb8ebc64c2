"""Which function's code the modules of this process were imported from.

Python keeps one module per name in a process (``sys.modules``), and a function's code is
imported by name (``shout.py`` is module ``shout``). Where one process loads several
functions (the worker's thread runtime, a Spark executor replaying one function after
another, a test session), a second ``shout.py`` would get the first one's module, and a
function updated at the same path, or at a new one, would keep its old code.

So before the code of a function is imported, each module imported earlier from a
function's code is looked up in its search paths, as an import would find it; one found
there in another file (another function's), or changed on disk since, is dropped, and the
function's paths go first on ``sys.path``: it gets its own code. A function loaded before
keeps the objects it already holds (its ``process`` and what its module imported); only
code of its that imports a module by name later gets the newer one, which is why such a
replacement is logged. Modules that did not come from a function's code (installed
packages, Magnetar's own) are never dropped, nor a package with compiled modules (an
extension cannot be loaded twice in a process): the later function shares the first one's.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

__all__ = ["modules_of", "own_modules"]

log = logging.getLogger(__name__)

_lock = threading.RLock()


@dataclass(frozen=True)
class _Origin:
    file: Path
    stamp: tuple[int, int]
    """The file's modification time (ns) and size when it was imported."""


_EXTENSIONS = tuple(importlib.machinery.EXTENSION_SUFFIXES)

_imported: dict[str, _Origin] = {}
"""Modules imported from functions' code, by name (submodules included)."""


@contextmanager
def own_modules(search_paths: list[Path]) -> Iterator[None]:
    """Within this, importing by name gives the modules of ``search_paths``, as they are
    on disk now; the modules imported meanwhile from them are recorded as theirs."""
    with _lock:
        if any([_drop_if_other(name, search_paths) for name in _top_level_imported()]):
            importlib.invalidate_caches()  # the finders' listings of changed directories
        for path in reversed(search_paths):
            entry = str(path)
            if entry in sys.path:
                sys.path.remove(entry)
            sys.path.insert(0, entry)
        before = set(sys.modules)
        try:
            yield
        finally:
            roots = _roots(search_paths)
            for name in set(sys.modules) - before:
                file = _file_of(name)
                if file is not None and str(file).startswith(roots):
                    _imported[name] = _Origin(file, _stamp(file))


def modules_of(search_paths: list[Path]) -> dict[str, ModuleType]:
    """The modules of this process imported from ``search_paths``, by name: a function's own,
    for finding them by name later whatever another function imports meanwhile."""
    roots = _roots(search_paths)
    with _lock:
        return {
            name: sys.modules[name]
            for name, origin in _imported.items()
            if name in sys.modules and str(origin.file).startswith(roots)
        }


def _roots(search_paths: list[Path]) -> tuple[str, ...]:
    """The prefixes of the files in ``search_paths``."""
    return tuple(os.path.join(path, "") for path in search_paths)


def _top_level_imported() -> list[str]:
    """The top-level modules imported from functions' code that this process still has
    (the others are forgotten)."""
    for name in [n for n in _imported if n not in sys.modules]:
        del _imported[name]
    return [name for name in _imported if "." not in name]


def _file_in(name: str, search_paths: list[Path]) -> Path | None:
    """The file module ``name`` would be imported from in ``search_paths``, if any."""
    spec = importlib.machinery.PathFinder.find_spec(name, [str(p) for p in search_paths])
    origin = spec.origin if spec is not None else None
    return Path(origin) if origin else None


def _drop_if_other(name: str, search_paths: list[Path]) -> bool:
    """Drop module ``name`` (and its submodules), imported from a function's code, if
    ``search_paths`` have one of that name in another file, or the files changed since;
    whether it did."""
    origin = _imported[name]
    file = _file_in(name, search_paths)
    if file is None:
        return False
    loaded = [n for n in sys.modules if n == name or n.startswith(name + ".")]
    if origin.file == file and all(_unchanged(n) for n in loaded):
        return False
    compiled = [n for n in loaded if str(_file_of(n)).endswith(_EXTENSIONS)]
    if compiled:
        log.warning(
            "module %r: %s is not imported; this process keeps the one from %s, whose "
            "compiled module %s cannot be loaded twice",
            name,
            file,
            origin.file,
            compiled[0],
        )
        return False
    if origin.file != file:
        log.info(
            "module %r: importing %s in place of %s, imported earlier in this process (a "
            "function still running that code gets this one if it imports %r by name now)",
            name,
            file,
            origin.file,
            name,
        )
    for module in loaded:
        del sys.modules[module]
        _imported.pop(module, None)
    return True


def _unchanged(name: str) -> bool:
    """Whether module ``name``'s file is as it was imported (or it is not a function's)."""
    origin = _imported.get(name)
    return origin is None or origin.stamp == _stamp(origin.file)


def _file_of(name: str) -> Path | None:
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    return Path(file) if isinstance(file, str) else None


def _stamp(file: Path) -> tuple[int, int]:
    try:
        status = file.stat()
    except OSError:
        return (0, 0)
    return (status.st_mtime_ns, status.st_size)
