"""Abstract Unix sockets and signals, scoped to an isolated instance's own processes.

A Unix socket in the abstract namespace (a name starting with a NUL byte) has no file, so
neither file permissions nor the instance's read-only view of the files (``sandbox``) hold
it: any process of the host's network namespace may connect to it, whatever its uid. That is
how CVE-2020-15257 gave root to containers on the host's network: containerd's shim listened
on one. Landlock's scopes (Linux 6.12, Landlock ABI 6) close it: once ``scope_to_own``
has run, the process and what it starts may connect only to abstract sockets made by
processes of the same Landlock domain, and signal only them. Every instance process makes a
domain of its own, so neither the worker, nor the host's services, nor other tenants'
instances are reached. Sockets with a file are left to file permissions.

It handles no file or network access: what the domain holds is only its scopes (files are
``sandbox``'s, and the network the worker's nftables rules'; see
``magnetar.worker.instance_network``).
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["SCOPE_ABI", "scope_to_own", "scopes_unavailable"]

SCOPE_ABI = 6
"""The first Landlock ABI with scopes."""

_CREATE_RULESET, _RESTRICT_SELF = 444, 446  # the same on every architecture (Linux 5.13)
_CREATE_RULESET_VERSION = 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2

_libc = ctypes.CDLL(None, use_errno=True)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


def scopes_unavailable() -> str | None:
    """Why this kernel cannot scope abstract sockets and signals, or None."""
    abi = _libc.syscall(
        _CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_long(_CREATE_RULESET_VERSION)
    )
    if abi < 0:
        return f"Landlock is not enabled in this kernel ({os.strerror(ctypes.get_errno())})"
    if abi < SCOPE_ABI:
        return f"this kernel's Landlock (ABI {abi}) has no scopes (ABI {SCOPE_ABI}, Linux 6.12)"
    return None


def scope_to_own() -> None:
    """Put this thread, and the threads and processes it starts from now on, in a Landlock
    domain of their own scoping abstract Unix sockets and signals (see the module doc).
    Threads started earlier are not. Needs root or ``PR_SET_NO_NEW_PRIVS``; OSError if the
    kernel refuses (``scopes_unavailable`` says why first)."""
    attr = _RulesetAttr(0, 0, _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL)
    ruleset = _libc.syscall(
        _CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_long(0)
    )
    if ruleset < 0:
        raise _error("create a Landlock ruleset")
    try:
        if _libc.syscall(_RESTRICT_SELF, ctypes.c_long(ruleset), ctypes.c_long(0)) < 0:
            raise _error("enter a Landlock domain")
    finally:
        os.close(ruleset)


def _error(action: str) -> OSError:
    number = ctypes.get_errno()
    return OSError(number, f"cannot {action}: {os.strerror(number)}")
