"""What an instance process may do once it runs user code: the OS user it runs as and the
environment it sees.

Function code is arbitrary code. A worker that runs as root hands each instance process an
``InstanceUser``: before anything of the function is imported, the process drops every
supplementary group, takes the user's gid and uid (which have no passwd entry: none is
needed) with a limit on its processes and threads, forbids itself new privileges
(``PR_SET_NO_NEW_PRIVS``: no setuid binary gives them back) and moves into its own working
directory. What the worker keeps (its data directory, key files, config, other instances'
directories) is then out of reach by file permissions.

Python itself must stay reachable: an interpreter installed under a directory others cannot
search (pyenv under ``/root``, a virtualenv in a private home) would leave the function
unable to import anything not loaded yet. Such a process first takes a mount namespace of
its own, in which each such directory is an empty tmpfs holding only bind mounts of what the
instance needs (the interpreter, its import paths and its own directory): the rest of that
directory stays out of sight.

The environment is scrubbed whether or not the user changes: the worker's settings
(``MAGNETAR_*``, its token settings among them) and Pulsar's client credentials
(``PULSAR_*AUTH*``, ``PULSAR_*TOKEN*``) are dropped. The rest is kept on purpose: it is what
Python needs and where the environment secrets provider finds a function's secrets.
"""

from __future__ import annotations

import ctypes
import os
import re
import resource
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["InstanceUser", "drop_privileges", "instance_environment"]

_PR_SET_NO_NEW_PRIVS = 38
_WORKER_SETTINGS = "MAGNETAR_"
_PULSAR_CREDENTIALS = re.compile(r"^PULSAR_.*(AUTH|TOKEN)")


@dataclass(frozen=True)
class InstanceUser:
    """The unprivileged OS user an instance process runs as, and its working directory."""

    uid: int
    gid: int
    work_dir: Path
    """The instance's own directory (mode 0700, owned by ``uid``): its cwd and ``HOME``."""
    max_tasks: int = 1024
    """Processes and threads the user may have at once (``RLIMIT_NPROC``; the uid is the
    instance's alone): a fork bomb stops there instead of taking the host's."""


def drop_privileges(user: InstanceUser) -> None:
    """Become ``user`` for good (this process and its threads): no supplementary groups,
    its gid and uid (real, effective and saved), no new privileges, its directory as cwd
    and home, at most ``max_tasks`` processes and threads. Raises ``PermissionError``
    unless the process may (it must be root)."""
    _keep_reachable([*_python_paths(), user.work_dir])
    # hard as well as soft: without privileges the process cannot raise it again
    resource.setrlimit(resource.RLIMIT_NPROC, (user.max_tasks, user.max_tasks))
    os.setgroups([])
    os.setresgid(user.gid, user.gid, user.gid)
    os.setresuid(user.uid, user.uid, user.uid)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.chdir(user.work_dir)
    os.environ["HOME"] = str(user.work_dir)
    os.environ["TMPDIR"] = str(user.work_dir / "tmp")


def instance_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` without the worker's settings and Pulsar client credentials."""
    return {
        name: value
        for name, value in environment.items()
        if not name.upper().startswith(_WORKER_SETTINGS)
        and not _PULSAR_CREDENTIALS.match(name.upper())
    }


_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18


def _python_paths() -> list[Path]:
    """What the instance imports and runs from: the interpreter, its prefixes, its import
    paths, and Magnetar (an editable install is not on ``sys.path``)."""
    import magnetar

    paths = [Path(sys.base_prefix), Path(sys.prefix), Path(os.path.realpath(sys.executable))]
    paths += [Path(entry) for entry in sys.path if entry and os.path.isdir(entry)]
    paths.append(Path(magnetar.__file__).parent.parent)
    return [path.resolve() for path in paths]


def _blocked_ancestor(path: Path) -> Path | None:
    """The topmost directory above ``path`` that others may not search."""
    for directory in reversed(path.parents):
        if not os.stat(directory).st_mode & stat.S_IXOTH:
            return directory
    return None


def _keep_reachable(paths: list[Path]) -> None:
    """Make ``paths`` reachable to any user in this process's own mount namespace (see the
    module doc); nothing changes when they already are."""
    blocked: dict[Path, list[Path]] = {}
    for path in sorted(set(paths)):
        top = _blocked_ancestor(path)
        covered = any(path.is_relative_to(other) for other in blocked.get(top, [])) if top else True
        if top is not None and not covered:
            blocked.setdefault(top, []).append(path)
    if not blocked:
        return
    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source: str, target: Path, kind: str | None, flags: int, data: str | None) -> None:
        if libc.mount(
            source.encode(),
            str(target).encode(),
            kind and kind.encode(),
            flags,
            data and data.encode(),
        ):
            error = ctypes.get_errno()
            raise PermissionError(
                f"cannot make {target} reachable to the instance's user ({os.strerror(error)}): "
                "install Python where every user can read it, make its directories searchable "
                "(chmod o+x), or turn instance_isolation off"
            )

    if libc.unshare(_CLONE_NEWNS):
        raise PermissionError(f"cannot take a mount namespace: {os.strerror(ctypes.get_errno())}")
    mount("none", Path("/"), None, _MS_REC | _MS_PRIVATE, None)  # nothing leaks to the host
    for top, inside in blocked.items():
        handles = [os.open(path, os.O_PATH) for path in inside]  # before the tmpfs hides them
        mount("tmpfs", top, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=64k")
        for path, handle in zip(inside, handles, strict=True):
            if os.path.isdir(f"/proc/self/fd/{handle}"):
                path.mkdir(parents=True, exist_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            mount(f"/proc/self/fd/{handle}", path, None, _MS_BIND | _MS_REC, None)
            os.close(handle)
