"""Finding processes by ancestry and name in /proc (Linux), as tests and benchmarks kill
them: a worker's instance processes are forked by its fork server, so they are not its
children."""

from __future__ import annotations

from pathlib import Path

__all__ = ["descendants_named"]


def descendants_named(ancestor: int, name: str) -> list[int]:
    """Pids of the processes below ``ancestor`` (children, grandchildren...) whose name, as
    ``ps`` shows it (/proc/<pid>/comm), is ``name``."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # pid (comm) state ppid ...; comm may hold spaces and parentheses
        comm, rest = stat.split(" (", 1)[1].rsplit(") ", 1)
        names[int(entry.name)], parents[int(entry.name)] = comm, int(rest.split()[1])

    def descends(pid: int) -> bool:
        seen = 0
        while pid in parents and seen < 64:
            pid, seen = parents[pid], seen + 1
            if pid == ancestor:
                return True
        return False

    return sorted(pid for pid, comm in names.items() if comm == name and descends(pid))
