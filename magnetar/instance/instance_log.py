"""Each instance's own log file: its stdout, stderr and logging, size-bounded and rotated.

Where Apache's process runtime puts it: ``logs/functions/<tenant>/<namespace>/<name>/
<name>-<instanceId>.log`` under the worker's log directory. A function that prints megabytes
per message fills its own file, which rolls over at ``max_bytes`` keeping ``backups`` older
ones, and never the worker's log. Python's writes (``print``, ``sys.stderr``, logging) go
through the rotating handler; the process's file descriptors 1 and 2 point at the current file
too (moved at each rollover), so what native code writes (the Pulsar client's log, an
extension's printf) lands there as well and is counted at the next Python write.
"""

from __future__ import annotations

import io
import logging
import logging.handlers
import os
import sys
from pathlib import Path

__all__ = ["InstanceLog", "instance_log_path", "read_log"]

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_BACKUPS = 2


def instance_log_path(root: Path, fqfn: str, instance_id: int) -> Path:
    """``root/functions/<tenant>/<namespace>/<name>/<name>-<instance_id>.log``."""
    tenant, namespace, name = fqfn.split("/")
    return root / "functions" / tenant / namespace / name / f"{name}-{instance_id}.log"


class _Handler(logging.handlers.RotatingFileHandler):
    """Rotates, and points the process's stdout and stderr at the new file each time."""

    def doRollover(self) -> None:  # noqa: N802 (logging's name)
        super().doRollover()
        self._redirect()

    def _redirect(self) -> None:
        if self.stream is not None:
            self.stream.flush()
            for descriptor in (1, 2):
                os.dup2(self.stream.fileno(), descriptor)

    def write_text(self, text: str) -> None:
        """Raw text (a print), rolled over like a record."""
        self.acquire()
        try:
            if self.stream is None:
                self.stream = self._open()
            if os.fstat(self.stream.fileno()).st_size + len(text) > self.maxBytes > 0:
                self.doRollover()
            self.stream.write(text)
            self.stream.flush()
        finally:
            self.release()


class _Stream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` of the instance: text into its log file."""

    def __init__(self, handler: _Handler) -> None:
        self._handler = handler

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._handler.write_text(text)
        return len(text)


class InstanceLog:
    """Sends this process's output to an instance's log file; ``format`` is for records."""

    def __init__(
        self,
        path: Path,
        level: int,
        format: str,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = DEFAULT_BACKUPS,
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = _Handler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        handler.setFormatter(logging.Formatter(format))
        handler._redirect()
        root = logging.getLogger()
        for previous in list(root.handlers):
            root.removeHandler(previous)
        root.addHandler(handler)
        root.setLevel(level)
        stream = _Stream(handler)
        sys.stdout = sys.stderr = stream


def read_log(path: Path, lines: int, since: int | None = None) -> tuple[str, int]:
    """The last ``lines`` lines of a log file (with ``since``, a byte offset a previous read
    returned: what was written after it instead), and the offset to read on from."""
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        if since is not None and since <= size:
            file.seek(since)
            return file.read().decode("utf-8", errors="replace"), size
        # the last lines: from a block near the end, enough for them (or the whole file)
        block = max(lines * 400, 64 * 1024)
        file.seek(max(0, size - block))
        text = file.read().decode("utf-8", errors="replace")
    kept = text.splitlines(keepends=True)[-lines:] if lines > 0 else []
    return "".join(kept), size
