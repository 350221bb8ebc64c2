"""The files and IPC objects an isolated instance process can reach.

A uid of its own keeps an instance out of what others own, but not out of what every user
may write: ``/tmp``, ``/var/tmp``, ``/dev/shm`` and System V IPC. There, what one instance
leaves outlives it: a file its uid owns is read by the next instance handed that uid (uids
are reused, across tenants), and ``/dev/shm`` or a shared memory segment holds the host's
memory after the instance has gone. So an isolated instance runs in a mount and an IPC
namespace of its own (``detach``), in which (``confine``):

- every file system is read-only, except the instance's own directory;
- ``/tmp``, ``/var/tmp`` and ``/dev/shm`` are its own: one tmpfs of ``tmp_bytes`` (its
  ``resources.ram``) for the three, gone with the process;
- System V shared memory, semaphores and message queues are its own, destroyed when it exits;
- ``/proc`` shows its own processes only (``hidepid=2``): not the worker's, nor other
  tenants' instances, their command lines and names.

Python itself must stay reachable: an interpreter installed under a directory others cannot
search (pyenv under ``/root``, a virtualenv in a private home) would leave the function
unable to import anything not loaded yet. Each such directory becomes an empty tmpfs holding
only bind mounts of what the instance needs (the interpreter, its import paths and its own
directory): the rest of it stays out of sight. That takes a mount namespace too, and is done
(``keep_reachable``) even where the private view is not.

Namespaces take CAP_SYS_ADMIN: ``probe`` says whether this host lets a worker give them.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["confine", "detach", "keep_reachable", "probe", "python_paths"]

PRIVATE_DIRS = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))
"""Where every user may write: private to each instance."""

_CLONE_NEWNS, _CLONE_NEWIPC = 0x00020000, 0x08000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
_SYS_MOUNT_SETATTR = 442  # the same on every architecture (Linux 5.12)
_AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = -100, 0x8000, 0x1
_BLOCKED_TMPFS = "mode=0755,size=64k"
"""A directory others cannot search, replaced: it holds only mount points."""

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def detach(ipc: bool = True) -> None:
    """Take a mount namespace of this process's own (and with ``ipc`` an IPC namespace),
    whose mounts never reach the host's. Only before a thread starts: a namespace belongs to
    a thread, and threads started earlier would keep the host's view (and user code could
    reach it through their ``/proc/self/task/<tid>/root``)."""
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:
        raise RuntimeError(f"a namespace must be taken before any thread starts ({threads} run)")
    if _libc.unshare(_CLONE_NEWNS | (_CLONE_NEWIPC if ipc else 0)):
        raise PermissionError(f"cannot take a namespace: {os.strerror(ctypes.get_errno())}")
    _mount("none", Path("/"), None, _MS_REC | _MS_PRIVATE, None)


def confine(reach: list[Path], own: Path, tmp_bytes: int | None) -> None:
    """In the namespace ``detach`` took: make every file system read-only but ``own``, give
    ``PRIVATE_DIRS`` one tmpfs of ``tmp_bytes`` (None: the kernel's default, half the
    memory), and keep ``reach`` and ``own`` at their paths (see the module doc)."""
    private = _private_dirs()
    bound = _cover([*reach, own], private, tmp_bytes)
    if own not in bound:  # a mount of its own, to be writable alone
        _mount(str(own), own, None, _MS_BIND, None)
    # a proc of its own (Linux 5.8 and later: its options are not the host's)
    _mount("proc", Path("/proc"), "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "hidepid=2")
    _set_readonly(Path("/"), True, recursive=True)
    for directory in [own, *private]:
        _set_readonly(directory, False, recursive=False)


def keep_reachable(reach: list[Path], detached: bool) -> None:
    """Make ``reach`` reachable to any user, in a mount namespace of this process's own when
    a directory above one of them is not searchable (see the module doc); ``detached``: the
    process took one already."""
    if not any(_blocked_ancestor(path) for path in reach):
        return
    try:
        if not detached:
            detach(ipc=False)
        _cover(reach, [], None)
    except PermissionError as error:
        raise PermissionError(
            f"{error}: install Python where every user can read it, make its directories "
            "searchable (chmod o+x), or turn instance_isolation off"
        ) from None


def python_paths() -> list[Path]:
    """What the instance imports and runs from: the interpreter, its prefixes, its import
    paths, and Magnetar (an editable install is not on ``sys.path``)."""
    import magnetar

    paths = [Path(sys.base_prefix), Path(sys.prefix), Path(os.path.realpath(sys.executable))]
    paths += [Path(entry) for entry in sys.path if entry and os.path.isdir(entry)]
    paths.append(Path(magnetar.__file__).parent.parent)
    return [path.resolve() for path in paths]


@functools.cache
def probe() -> str | None:
    """None when this host lets an instance process take the private view (root with
    CAP_SYS_ADMIN, Linux 5.12 or later), else why not; tried once, in a process of its own."""
    own = tempfile.mkdtemp(prefix="magnetar-sandbox-probe-")
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, own],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    finally:
        shutil.rmtree(own, ignore_errors=True)
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    why: str | None = json.loads(done.stdout)["error"]
    return why


def _private_dirs() -> list[Path]:
    """``PRIVATE_DIRS`` that exist, once each (``/var/tmp`` may be a link to ``/tmp``)."""
    found: dict[Path, None] = {}
    for directory in PRIVATE_DIRS:
        if directory.is_dir() and _blocked_ancestor(directory) is None:
            found.setdefault(directory.resolve())
    return list(found)


def _private_tmpfs(directories: list[Path], tmp_bytes: int | None) -> None:
    """One tmpfs for ``directories``: mounted on the first, a sticky world-writable folder
    in it bound onto each (onto the first last, hiding the others' folders)."""
    first = directories[0]
    size = f",size={tmp_bytes}" if tmp_bytes is not None else ""
    _mount("tmpfs", first, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=0755{size}")
    folders = []
    for number in range(len(directories)):
        folder = first / f".private-{number}"
        folder.mkdir()
        folder.chmod(0o1777)
        folders.append(folder)
    for directory, folder in reversed(list(zip(directories, folders, strict=True))):
        _mount(str(folder), directory, None, _MS_BIND, None)


def _cover(reach: list[Path], private: list[Path], tmp_bytes: int | None) -> set[Path]:
    """Hide the ``private`` directories (under one tmpfs of ``tmp_bytes``) and each directory
    above a path of ``reach`` that others cannot search, binding the paths of ``reach`` under
    them back in place; the paths so bound."""
    tops = set(private) | {top for path in reach if (top := _blocked_ancestor(path)) is not None}
    tops = {top for top in tops if not _below_another(top, tops)}
    # a path at or above a private directory is not brought back: that would undo it
    inside = {
        path for path in reach if any(path != top and path.is_relative_to(top) for top in tops)
    }
    inside = {path for path in inside if not _below_another(path, inside)}  # comes along
    handles = {path: os.open(path, os.O_PATH) for path in sorted(inside)}  # before mounts hide them
    try:
        if private:
            _private_tmpfs(private, tmp_bytes)
        for top in tops - set(private):
            _mount("tmpfs", top, "tmpfs", _MS_NOSUID | _MS_NODEV, _BLOCKED_TMPFS)
        for path, handle in handles.items():
            _mount_point(path, os.path.isdir(f"/proc/self/fd/{handle}"))
            _mount(f"/proc/self/fd/{handle}", path, None, _MS_BIND | _MS_REC, None)
    finally:
        for handle in handles.values():
            os.close(handle)
    return set(handles)


def _mount_point(path: Path, directory: bool) -> None:
    """Make ``path`` (a folder or a file) to mount on, and the folders above it, which
    others may pass through but not list (as the instances' directories above their own)."""
    for folder in [*reversed(path.parents), *([path] if directory else [])]:
        if not folder.exists():
            folder.mkdir(0o711)
            folder.chmod(0o711)  # whatever the umask
    if not directory:
        path.touch()


def _below_another(path: Path, others: set[Path]) -> bool:
    return any(other != path and path.is_relative_to(other) for other in others)


def _blocked_ancestor(path: Path) -> Path | None:
    """The topmost directory above ``path`` that others may not search."""
    for directory in reversed(path.parents):
        if not os.stat(directory).st_mode & stat.S_IXOTH:
            return directory
    return None


def _mount(source: str, target: Path, kind: str | None, flags: int, data: str | None) -> None:
    if _libc.mount(
        source.encode(), str(target).encode(), kind and kind.encode(), flags, data and data.encode()
    ):
        error = ctypes.get_errno()
        raise PermissionError(f"cannot mount {target} for the instance: {os.strerror(error)}")


def _set_readonly(target: Path, readonly: bool, recursive: bool) -> None:
    flag = _MountAttr(*((_MOUNT_ATTR_RDONLY, 0) if readonly else (0, _MOUNT_ATTR_RDONLY)), 0, 0)
    if _libc.syscall(
        _SYS_MOUNT_SETATTR,
        _AT_FDCWD,
        str(target).encode(),
        _AT_RECURSIVE if recursive else 0,
        ctypes.byref(flag),
        ctypes.sizeof(flag),
    ):
        error = ctypes.get_errno()
        state = "read-only" if readonly else "writable"
        raise PermissionError(f"cannot make {target} {state}: {os.strerror(error)}")


def _try(own: Path) -> None:
    """``probe``'s process: take the private view with ``own`` as its directory."""
    try:
        detach()
        confine(python_paths(), own, 1024 * 1024)
        (own / "written").write_text("")
        (PRIVATE_DIRS[0] / "written").write_text("")
    except (OSError, RuntimeError) as error:
        json.dump({"error": str(error)}, sys.stdout)
        return
    json.dump({"error": None}, sys.stdout)


if __name__ == "__main__":
    _try(Path(sys.argv[1]))
