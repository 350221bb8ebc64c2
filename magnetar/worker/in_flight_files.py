"""Where the in-flight records of instances that are not isolated are kept (an isolated
instance keeps its own in its directory): a folder per worker process, in memory where there
is a tmpfs (``/dev/shm``: the record is written for every message).

The folder is made when the first such instance starts, and removed when the runtime closes.
A worker killed before that leaves it behind, so its name holds the worker's pid, and the
next worker to make one removes the folders of workers that are gone.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import threading
from pathlib import Path

from magnetar.worker.pids import pid_alive

__all__ = ["InFlightFiles"]

_PREFIX = "magnetar-in-flight-"


class InFlightFiles:
    """Paths for in-flight records, one per instance start, in this worker's folder."""

    def __init__(self, base: Path | None = None) -> None:
        shm = Path("/dev/shm")
        self._base = base or (shm if shm.is_dir() else Path(tempfile.gettempdir()))
        self._folder: Path | None = None
        self._numbers = itertools.count()
        self._lock = threading.Lock()  # instances start from several threads

    def next_path(self) -> str:
        with self._lock:
            if self._folder is None:
                self._remove_left_behind()
                prefix = f"{_PREFIX}{os.getpid()}-"
                self._folder = Path(tempfile.mkdtemp(prefix=prefix, dir=self._base))
            return str(self._folder / str(next(self._numbers)))

    def remove(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def _remove_left_behind(self) -> None:
        for folder in self._base.glob(f"{_PREFIX}*-*"):
            pid = folder.name.removeprefix(_PREFIX).partition("-")[0]
            with contextlib.suppress(OSError):
                mine = folder.lstat().st_uid == os.geteuid() and folder.is_dir()
                if mine and pid.isdigit() and not pid_alive(int(pid)):
                    shutil.rmtree(folder)
