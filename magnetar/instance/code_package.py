"""A Python function's code package on disk: a ``.py`` file, a ``.zip`` or a wheel, with the
dependencies it carries installed once per package digest.

* A zip holds the module at its root, under ``src/`` or under a single top-level folder (the
  layout ``pulsar-admin`` builds: ``func/src``, ``func/requirements.txt``, ``func/deps``).
  A ``requirements.txt`` and the wheels in ``deps/`` are installed with pip into the package's
  own ``site`` folder: from the package's wheels alone (offline) when they cover the
  requirements, else from the package index.
* A wheel (``.whl``) is installed the same way, with the dependencies its metadata declares.

The package is unpacked into ``<work dir>/<name>-<sha256 prefix>``; the first instance to
need it unpacks and installs (under a file lock) and marks it complete, and every later start
of any instance of that package only finds the mark. An install that fails is a
``FunctionLoadError`` with pip's last lines, so the function's status says why.

Unpacking stays within ``ArchiveLimits`` (see ``magnetar.instance.archive``): a zip is
extracted counting what it inflates to, a wheel (the package itself or one in ``deps/``) is
checked by its directory before pip unpacks it; a package past a limit is an
``ArchiveLimitError`` that names the limit.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from magnetar.instance.archive import (
    DEFAULT_ARCHIVE_LIMITS,
    ArchiveLimits,
    check_archive,
    extract_archive,
)
from magnetar.instance.exceptions import ArchiveLimitError, FunctionLoadError

__all__ = ["PACKAGE_SUFFIXES", "code_search_paths"]

PACKAGE_SUFFIXES = (".py", ".zip", ".whl")
_COMPLETE = ".complete"
_PIP_TIMEOUT_S = 600
_PIP_TAIL_LINES = 8


def code_search_paths(
    py: str | Path, work_dir: Path | None = None, limits: ArchiveLimits | None = None
) -> list[Path]:
    """The import paths for the code in ``py``, unpacked and installed under ``work_dir``
    (beside the package when None) first, within ``limits`` (the defaults when None)."""
    path = Path(py).expanduser().resolve()
    if not path.exists():
        raise FunctionLoadError(f"function file {py} does not exist")
    if path.suffix == ".py":
        return [path.parent]
    if path.suffix not in PACKAGE_SUFFIXES:
        raise FunctionLoadError(f"function file {py} must be a .py file, a .zip or a .whl wheel")
    target = (work_dir or path.parent / ".magnetar-code") / f"{path.stem}-{_digest(path)}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{target}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process unpacks and installs; others wait
        if not (target / _COMPLETE).exists():
            _prepare(path, target, limits or DEFAULT_ARCHIVE_LIMITS)
            (target / _COMPLETE).touch()
    return _search_paths(path, target)


def _prepare(path: Path, target: Path, limits: ArchiveLimits) -> None:
    site = target / "site"
    if path.suffix == ".whl":
        check_archive(path, limits)
        target.mkdir(exist_ok=True)
        _pip(path, site, [str(path)], offline_from=path.parent)
        return
    try:
        used = extract_archive(path, target / "code", limits)
    except ArchiveLimitError:
        shutil.rmtree(target / "code", ignore_errors=True)  # what it filled is freed at once
        raise
    except (FunctionLoadError, OSError) as error:
        shutil.rmtree(target / "code", ignore_errors=True)
        raise FunctionLoadError(f"cannot extract function package {path}: {error}") from None
    for root in _roots(target / "code"):
        requirements = root / "requirements.txt"
        wheels = sorted((root / "deps").glob("*.whl")) if (root / "deps").is_dir() else []
        for wheel in wheels:  # pip unpacks them: within what the zip left of the limits
            used = used + check_archive(wheel, limits.after(used))
        arguments = [str(w) for w in wheels]
        if requirements.is_file():
            arguments += ["-r", str(requirements)]
        if arguments:
            _pip(path, site, arguments, offline_from=root / "deps")


def _search_paths(path: Path, target: Path) -> list[Path]:
    paths = [target / "site"]
    if path.suffix == ".zip":
        for root in _roots(target / "code"):
            paths += [root, root / "src", root / "deps"]
    return [p for p in paths if p.is_dir()]


def _roots(code: Path) -> list[Path]:
    """The zip's root, and its single top-level folder if it has just one."""
    roots = [code]
    entries = [p for p in code.iterdir() if not p.name.startswith((".", "__MACOSX"))]
    if len(entries) == 1 and entries[0].is_dir():
        roots.append(entries[0])
    return roots


def _pip(package: Path, site: Path, arguments: list[str], offline_from: Path) -> None:
    """Install into ``site``: from the package's own wheels alone first, then (if that
    cannot satisfy everything) from the package index."""
    base = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    base += ["--no-warn-script-location", "--target", str(site), *arguments]
    offline = [*base, "--no-index", "--find-links", str(offline_from)]
    failure = _run(offline) if offline_from.is_dir() else "no wheels in the package"
    if failure is None:
        return
    failure = _run(base)
    if failure is not None:
        raise FunctionLoadError(f"installing the dependencies of {package.name} failed:\n{failure}")


def _run(command: list[str]) -> str | None:
    """None when the command succeeded, else the last lines it printed."""
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return f"pip did not finish within {_PIP_TIMEOUT_S} s"
    if result.returncode == 0:
        return None
    lines = (result.stderr or result.stdout).strip().splitlines()
    return "\n".join(lines[-_PIP_TAIL_LINES:]) or f"pip exited with code {result.returncode}"


def _digest(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()[:16]
