"""System calls an isolated instance may not make, refused by a seccomp filter.

A uid of its own and a view of the files of its own do not hold what the kernel does not
keep per user namespace or per file:

- **the kernel's keyrings** (``add_key``, ``request_key``, ``keyctl``) are kept per uid, and
  a uid's persistent keyring outlives its processes by days. Instance uids are handed out
  again, across tenants, so a key one tenant's function stored was read by the next
  function given that uid (Docker refuses these calls to containers for the same reason);
- **user namespaces** (``unshare`` or ``clone`` with ``CLONE_NEWUSER``) give an unprivileged
  process capabilities inside one, and with them the kernel code behind mounts and network
  configuration, where many of Linux's privilege escalations were found. ``clone3``, whose
  flags a filter cannot read, fails with ``ENOSYS``, and the C library falls back to
  ``clone`` (as under Docker's filter);
- **io_uring**, **bpf**, **userfaultfd** and **perf_event_open**: more of the kernel than a
  function needs, and the usual tools of kernel exploits.

Refused calls fail with ``EPERM``, as they do for a process without the privilege. The
filter holds for every thread of the process (``SECCOMP_FILTER_FLAG_TSYNC``) and what it
starts, and cannot be removed. It is built for x86-64 and arm64; on another machine the
worker says at start that there is none.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass

__all__ = ["filter_unavailable", "refuse_syscalls"]

_CLONE_NEWUSER = 0x10000000
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 1, 1
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_X32_BIT = 0x40000000
"""x86-64's x32 calls: the same numbers with this bit, refused whole."""


@dataclass(frozen=True)
class _Machine:
    """A machine's system call numbers (and its seccomp audit arch)."""

    audit_arch: int
    seccomp: int
    refused: tuple[int, ...]
    """add_key, request_key, keyctl, io_uring_setup, _enter, _register, bpf, userfaultfd,
    perf_event_open."""
    clone: int
    unshare: int


_MACHINES = {  # by platform.machine()
    "x86_64": _Machine(0xC000003E, 317, (248, 249, 250, 425, 426, 427, 321, 323, 298), 56, 272),
    "aarch64": _Machine(0xC00000B7, 277, (217, 218, 219, 425, 426, 427, 280, 282, 241), 220, 97),
}
_CLONE3 = 435  # the same on both

# classic BPF opcodes
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg 0's low word)

_libc = ctypes.CDLL(None, use_errno=True)


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def filter_unavailable() -> str | None:
    """Why no filter can be made on this machine, or None."""
    machine = platform.machine()
    if machine not in _MACHINES:
        return f"no system call filter is built for {machine} (only x86_64 and aarch64)"
    return None


def refuse_syscalls() -> None:
    """Install the filter on every thread of this process (see the module doc). Needs
    ``PR_SET_NO_NEW_PRIVS`` or root; OSError if the kernel refuses."""
    machine = _MACHINES[platform.machine()]
    program = _assemble(machine)
    buffer = ctypes.create_string_buffer(program)
    header = _Program(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    done = _libc.syscall(
        ctypes.c_long(machine.seccomp),
        ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
        ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC),
        ctypes.byref(header),
    )
    if done != 0:  # a positive result names a thread that could not be synchronized
        number = ctypes.get_errno() if done < 0 else errno.EBUSY
        raise OSError(number, f"cannot filter system calls: {os.strerror(number)}")


def _assemble(machine: _Machine) -> bytes:
    """The filter as classic BPF: refused calls, flags checked on clone and unshare."""
    # (opcode, jump if true, jump if false, operand): jumps name a label, or 0 for the next
    program: list[tuple[int, str | int, str | int, int]] = [
        (_LD_W_ABS, 0, 0, _ARCH),
        # another ABI (32-bit calls on a 64-bit kernel) numbers its calls otherwise: refused
        (_JEQ_K, 0, "eperm", machine.audit_arch),
        (_LD_W_ABS, 0, 0, _NR),
        (_JGE_K, "eperm", 0, _X32_BIT),
        *((_JEQ_K, "eperm", 0, number) for number in machine.refused),
        (_JEQ_K, "flags", 0, machine.clone),
        (_JEQ_K, "flags", 0, machine.unshare),
        (_JEQ_K, "enosys", 0, _CLONE3),
        (_RET_K, 0, 0, _RET_ALLOW),
        (_LD_W_ABS, 0, 0, _ARG0),  # flags:
        (_JSET_K, "eperm", 0, _CLONE_NEWUSER),
        (_RET_K, 0, 0, _RET_ALLOW),
        (_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),  # eperm:
        (_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),  # enosys:
    ]
    labels = {"flags": len(program) - 5, "eperm": len(program) - 2, "enosys": len(program) - 1}

    def offset(at: int, target: str | int) -> int:
        return target if isinstance(target, int) else labels[target] - at - 1

    return b"".join(
        struct.pack("=HBBI", code, offset(at, true), offset(at, false), operand)
        for at, (code, true, false, operand) in enumerate(program)
    )
