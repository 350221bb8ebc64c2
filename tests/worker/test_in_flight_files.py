"""The folder of a worker's in-flight records: made only when an instance needs it, gone
when the runtime closes, and what a killed worker left removed by the next."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from magnetar.worker.in_flight_files import InFlightFiles


def test_the_folder_is_made_by_the_first_path_and_removed_with_the_runtime(
    tmp_path: Path,
) -> None:
    files = InFlightFiles(tmp_path)
    assert list(tmp_path.iterdir()) == []  # a runtime that starts no instance leaves nothing
    first, second = Path(files.next_path()), Path(files.next_path())
    assert first.parent == second.parent and first != second
    assert first.parent.name.startswith(f"magnetar-in-flight-{os.getpid()}-")
    first.write_bytes(b"record")
    files.remove()
    assert list(tmp_path.iterdir()) == []


def test_a_killed_worker_s_folder_is_removed_by_the_next(tmp_path: Path) -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()  # its pid is no process's now
    left = tmp_path / f"magnetar-in-flight-{ended.pid}-abc123"
    left.mkdir()
    (left / "0").write_bytes(b"record")
    running = tmp_path / f"magnetar-in-flight-{os.getppid()}-def456"  # a live worker's
    running.mkdir()

    InFlightFiles(tmp_path).next_path()

    assert not left.exists()
    assert running.is_dir()
