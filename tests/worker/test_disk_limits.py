"""Disk limits: an isolated instance whose directory (the one place it may write) passes its
``resources.disk`` bytes or ``instance_max_files`` files is stopped, and its status says
which; and the measure counts what a directory holds, up to the file limit."""

from __future__ import annotations

import os
from pathlib import Path

import pulsar
import pytest

from magnetar.worker.disk_limits import DiskWatch, measure
from magnetar.worker.runtime import ProcessRuntime
from tests.integration.conftest import produce, wait_for
from tests.worker.conftest import (
    WORKER_ID,
    StartManager,
    function_config,
    instance_specs,
    isolation_in,
    system_exceptions,
)

FILLER = """
import os


def process(input):
    what, count = input.split()
    os.makedirs("fill", exist_ok=True)
    for number in range(int(count)):
        with open(f"fill/{number}", "wb") as file:
            file.write(os.urandom(1024 * 1024) if what == "mib" else b"")
    return input
"""


def test_a_directory_is_measured_in_bytes_on_disk_and_files_up_to_the_limit(
    tmp_path: Path,
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one").write_bytes(os.urandom(100_000))
    for number in range(10):
        (tmp_path / f"empty-{number}").touch()

    usage = measure(tmp_path, max_files=1000)
    assert usage.files == 12  # a folder, the file in it, and ten empty files
    assert 100_000 <= usage.bytes < 200_000  # blocks: the file's, and the folder's
    assert measure(tmp_path, max_files=5).files == 6  # counted one past the limit, no further
    assert measure(tmp_path / "gone", max_files=5).files == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="isolating instances needs root (CI runs as root)")
@pytest.mark.parametrize(
    ("order", "said"),
    [
        ("mib 4", "out of disk: over resources.disk 2097152 bytes (its directory held "),
        ("empty 150", "out of disk: its directory holds more than 100 files (instance_max_files)"),
    ],
)
def test_an_instance_that_fills_its_directory_is_stopped_and_says_why(
    tmp_path: Path,
    broker_url: str,
    client: pulsar.Client,
    start_manager: StartManager,
    topic: str,
    order: str,
    said: str,
) -> None:
    code = tmp_path / "filler.py"
    code.write_text(FILLER)
    isolation = isolation_in(tmp_path, range(480030, 480032))
    watch = DiskWatch(max_files=100, interval_s=0.2)
    config = function_config(py=str(code), inputs=[topic], resources={"disk": 2 * 1024 * 1024})
    (key,) = specs = instance_specs(config)
    runtime = ProcessRuntime(broker_url, WORKER_ID, isolation=isolation, disk_watch=watch)
    manager = start_manager(runtime, liveness_interval_s=0.1)
    manager.apply(specs)
    produce(client, topic, [order])

    wait_for(lambda: bool(system_exceptions(manager, key, "out of disk")), timeout=30)
    first = system_exceptions(manager, key, "out of disk")[0]
    assert first.startswith(said), first
