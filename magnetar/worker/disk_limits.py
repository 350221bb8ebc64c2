"""Disk limits of isolated instances: ``resources.disk`` bytes and ``instance_max_files``
files in the instance's own directory, the one place on disk it may write
(``magnetar.instance.sandbox``). Without them one function fills the disk the broker and
every other tenant's state live on.

No kernel counter says how much one directory holds (quotas need file systems mounted for
them), so a thread of the worker measures each instance's directory, as Kubernetes' kubelet
measures a pod's ephemeral storage: the directories one after another, then a pause of
``interval_s``, or fifty times what the scans took if that is longer (at most 2% of a core);
a directory is counted up to one file past ``max_files``. The runtime stops an instance over
either limit, gracefully, as one over its memory; its status says which.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DiskUsage", "DiskWatch", "measure"]


_PAUSE_PER_SCAN = 50
"""The pause after a round of scans, in multiples of what the round took."""


@dataclass
class DiskUsage:
    """What a directory held when it was last measured (zero before the first time)."""

    bytes: int = 0
    files: int = 0


def measure(directory: Path, max_files: int) -> DiskUsage:
    """The bytes allocated to ``directory``'s files and folders, and how many there are,
    counted up to ``max_files`` + 1 (links are not followed)."""
    usage = DiskUsage()
    pending = [str(directory)]
    while pending and usage.files <= max_files:
        try:
            entries = os.scandir(pending.pop())
        except OSError:  # gone, or not a folder
            continue
        with entries:
            for entry in entries:
                try:
                    found = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                usage.files += 1
                usage.bytes += found.st_blocks * 512
                if stat.S_ISDIR(found.st_mode):
                    pending.append(entry.path)
                if usage.files > max_files:
                    break
    return usage


class DiskWatch:
    """Measures the directories it is given, on a thread of its own (see the module doc)."""

    def __init__(self, max_files: int, interval_s: float = 10.0) -> None:
        self.max_files = max_files
        self.interval_s = interval_s
        self._watched: dict[Path, DiskUsage] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, directory: Path) -> DiskUsage:
        """Measure ``directory`` from now on; what it holds, kept up to date."""
        with self._lock:
            usage = self._watched.setdefault(directory, DiskUsage())
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="disk-watch", daemon=True)
                self._thread.start()
        return usage

    def forget(self, directory: Path) -> None:
        with self._lock:
            self._watched.pop(directory, None)

    def close(self) -> None:
        self._closed.set()

    def _run(self) -> None:
        while not self._closed.is_set():
            started = time.monotonic()
            with self._lock:
                directories = list(self._watched)
            for directory in directories:
                measured = measure(directory, self.max_files)
                with self._lock:
                    usage = self._watched.get(directory)
                    if usage is not None:  # not forgotten meanwhile
                        usage.bytes, usage.files = measured.bytes, measured.files
            took = time.monotonic() - started
            self._closed.wait(max(self.interval_s, _PAUSE_PER_SCAN * took))
