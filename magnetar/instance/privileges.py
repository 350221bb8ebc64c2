"""What an instance process may do once it runs user code: the OS user it runs as and the
environment it sees.

Function code is arbitrary code. A worker that runs as root hands each instance process an
``InstanceUser``: before anything of the function is imported, the process drops every
supplementary group, takes the user's gid and uid (which have no passwd entry: none is
needed) with a limit on its processes and threads, forbids itself new privileges
(``PR_SET_NO_NEW_PRIVS``: no setuid binary gives them back) and moves into its own working
directory. What the worker keeps (its data directory, key files, config, other instances'
directories) is then out of reach by file permissions.

What every user may write (``/tmp``, ``/dev/shm``, System V IPC) is not shared either: a
user with ``private`` set gets a view of its own (``magnetar.instance.sandbox``), read-only
but for its directory. Abstract Unix sockets, which no file permission holds, and signals
are scoped to the instance's own processes where the kernel can (``landlock``), and the
system calls of what the kernel keeps per uid or exposes most (its keyrings, user
namespaces, io_uring) are refused (``syscall_filter``).

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
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from magnetar.instance import landlock, sandbox, syscall_filter

__all__ = ["InstanceUser", "drop_privileges", "instance_environment", "scope_early"]

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
    private: bool = False
    """Whether the process gets a view of its own: the file systems read-only but for
    ``work_dir``, its own ``/tmp``, ``/var/tmp`` and ``/dev/shm``, its own IPC objects
    (``magnetar.instance.sandbox``; the worker sets it where the host allows)."""


def drop_privileges(
    user: InstanceUser,
    tmp_bytes: int | None = None,
    detached: bool = False,
    scoped: bool = False,
) -> None:
    """Become ``user`` for good (this process and its threads): its own view of the files
    (``private``: with ``tmp_bytes`` for its ``/tmp``, ``/var/tmp`` and ``/dev/shm``), its
    own abstract sockets and signals, no supplementary groups, its gid and uid (real,
    effective and saved), no new privileges, the system calls of ``syscall_filter`` refused,
    its directory as cwd and home, at most ``max_tasks`` processes and threads.
    ``detached``: the process took its namespaces already, before its threads started (an
    IPC one too if ``private``); ``scoped``: its Landlock scope likewise (``scope_early``).
    Raises ``OSError`` unless the process may (it must be root)."""
    if not scoped and landlock.scopes_unavailable() is None:
        landlock.scope_to_own()  # else the worker said at start that it cannot
    reach = [*sandbox.python_paths(), user.work_dir]
    if user.private:
        if not detached:
            sandbox.detach()
        sandbox.confine(reach, user.work_dir, tmp_bytes)
    else:
        sandbox.keep_reachable(reach, detached)
    # hard as well as soft: without privileges the process cannot raise it again
    resource.setrlimit(resource.RLIMIT_NPROC, (user.max_tasks, user.max_tasks))
    os.setgroups([])
    os.setresgid(user.gid, user.gid, user.gid)
    os.setresuid(user.uid, user.uid, user.uid)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if syscall_filter.filter_unavailable() is None:  # else the worker said so at start
            syscall_filter.refuse_syscalls()
    os.chdir(user.work_dir)
    os.environ["HOME"] = str(user.work_dir)
    os.environ["TMPDIR"] = str(user.work_dir / "tmp")


def scope_early() -> bool:
    """Take the Landlock scope of ``drop_privileges`` now, before any thread starts (threads
    started earlier would stay out of it); False where it cannot be taken here."""
    if landlock.scopes_unavailable() is not None:
        return False
    try:
        landlock.scope_to_own()
    except OSError:  # tried again by drop_privileges, which says why
        return False
    return True


def instance_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` without the worker's settings and Pulsar client credentials."""
    return {
        name: value
        for name, value in environment.items()
        if not name.upper().startswith(_WORKER_SETTINGS)
        and not _PULSAR_CREDENTIALS.match(name.upper())
    }
