"""The runtime manager against the real broker: instances start, survive crashes, stop."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pulsar
import pytest

from magnetar.instance.archive import ArchiveLimits
from magnetar.testing import descendants_named
from magnetar.worker.runtime import (
    INSTANCE_PROCESS_NAME,
    WARM_PROCESS_NAME,
    InstanceSpec,
    ProcessRuntime,
    ThreadRuntime,
    make_runtime,
)
from magnetar.worker.runtime_manager import BackoffPolicy
from tests.conftest import EXAMPLES
from tests.integration.conftest import collect, produce, values, wait_for
from tests.worker.conftest import (
    WORKER_ID,
    StartManager,
    function_config,
    instance_specs,
    pid_exists,
    receive_until,
)
from tests.zips import lying_zip

EXCLAMATION = {"example": "exclamation.py", "class_name": "exclamation.ExclamationFunction"}


def test_process_runtime_runs_each_instance_in_its_own_process(
    client: pulsar.Client, start_manager: StartManager, topic: str
) -> None:
    config = function_config(**EXCLAMATION, inputs=[topic], output=f"{topic}-out", parallelism=2)
    specs = instance_specs(config)
    manager = start_manager()
    manager.apply(specs)
    produce(client, topic, [f"hello-{i}" for i in range(20)])

    assert sorted(values(collect(client, f"{topic}-out", 20))) == sorted(
        f"hello-{i}!" for i in range(20)
    )
    wait_for(lambda: sum(s.processed for s in manager.statuses().values()) == 20)
    # both subscribed: on pulsar-lite one may take a subscribe timeout longer, when its
    # client drew the other's consumer id (magnetar.client), while the other took all 20;
    # one that crashed instead counts a restart below
    wait_for(lambda: manager.running_keys() == set(specs))
    pids = {manager.pid(key) for key in specs}
    assert len(pids) == 2 and os.getpid() not in pids
    assert all(pid is not None and pid_exists(pid) for pid in pids)
    for key, spec in specs.items():
        status = manager.statuses()[key].status()
        assert status["instanceId"] == spec.instance_id
        assert status["status"]["running"] is True
        assert status["status"]["error"] == ""
        assert status["status"]["numRestarts"] == 0
        assert status["status"]["workerId"] == WORKER_ID


def test_killed_instance_process_is_restarted_and_counted(
    client: pulsar.Client, start_manager: StartManager, topic: str
) -> None:
    config = function_config(**EXCLAMATION, inputs=[topic], output=f"{topic}-out")
    (key,) = specs = instance_specs(config)
    manager = start_manager()
    manager.apply(specs)
    produce(client, topic, [f"before-{i}" for i in range(10)])
    assert sorted(values(collect(client, f"{topic}-out", 10))) == sorted(
        f"before-{i}!" for i in range(10)
    )
    first_pid = manager.pid(key)
    assert first_pid is not None

    os.kill(first_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: manager.pid(key) not in (None, first_pid) and key in manager.running_keys())
    assert time.monotonic() - killed_at < 3.0
    assert not pid_exists(first_pid)

    after = {f"after-{i}!" for i in range(10)}
    produce(client, topic, [f"after-{i}" for i in range(10)])
    # at-least-once: inputs not yet acknowledged at the kill may come again, none is lost
    assert after <= set(receive_until(client, f"{topic}-out", after))
    status = manager.status(key)
    assert status is not None
    assert status.running is True
    assert status.num_restarts == 1
    crashes = [e.exception_string for e in status.latest_system_exceptions]
    assert any("SIGKILL" in crash for crash in crashes), crashes


def test_function_failing_at_import_is_restarted_with_growing_backoff(
    client: pulsar.Client, start_manager: StartManager, topic: str, tmp_path: Path
) -> None:
    broken = tmp_path / "broken_fn.py"
    broken.write_text(
        "raise RuntimeError('model file missing')\n\ndef process(input):\n    return input\n"
    )
    (broken_key,) = broken_specs = instance_specs(function_config(py=str(broken), inputs=[topic]))
    healthy = instance_specs(
        function_config(**EXCLAMATION, inputs=[f"{topic}-2"], output=f"{topic}-2-out")
    )
    manager = start_manager(
        restart_backoff=BackoffPolicy(initial_s=0.3, multiplier=3.0, max_s=10.0),
        liveness_interval_s=0.1,
    )
    manager.apply({**broken_specs, **healthy})

    # How long the instance stays down after each crash: the backoff delay, growing.
    downtimes: dict[int, float] = {}
    down_since: float | None = None
    errors: set[str] = set()
    deadline = time.monotonic() + 20
    while len(downtimes) < 3 and time.monotonic() < deadline:
        status = manager.status(broken_key)
        assert status is not None
        now = time.monotonic()
        if status.num_restarts > len(downtimes) and down_since is not None:
            downtimes[status.num_restarts] = now - down_since
            down_since = None
        elif not status.running and status.error and down_since is None:
            down_since = now
            errors.add(status.error)
        time.sleep(0.02)
    assert sorted(downtimes) == [1, 2, 3], downtimes
    # delays of 0.3 s, 0.9 s and 2.7 s (less a little for when the crash was first seen)
    assert downtimes[1] < downtimes[2] < downtimes[3], downtimes
    assert downtimes[2] > 0.75 and downtimes[3] > 2.5, downtimes
    assert errors and all("model file missing" in error for error in errors), errors
    status = manager.status(broken_key)
    assert status is not None
    assert any("model file missing" in e.exception_string for e in status.latest_system_exceptions)

    # the manager itself is unharmed: the other function still works
    produce(client, f"{topic}-2", ["still here"])
    assert values(collect(client, f"{topic}-2-out", 1)) == ["still here!"]


def test_apply_restarts_a_changed_version_and_stops_a_removed_instance(
    client: pulsar.Client, start_manager: StartManager, topic: str
) -> None:
    config = function_config(**EXCLAMATION, inputs=[topic], output=f"{topic}-out")
    (key,) = instance_specs(config)
    manager = start_manager()
    manager.apply(instance_specs(config, version=1))
    produce(client, topic, ["one"])
    assert values(collect(client, f"{topic}-out", 1)) == ["one!"]
    first_pid = manager.pid(key)
    assert first_pid is not None

    manager.apply(instance_specs(config, version=2))
    wait_for(lambda: manager.pid(key) not in (None, first_pid))
    assert not pid_exists(first_pid)  # the old version exited before the new one started
    produce(client, topic, ["two"])
    assert values(collect(client, f"{topic}-out", 1)) == ["two!"]
    second_pid = manager.pid(key)
    assert second_pid is not None

    manager.apply({})
    assert manager.running_keys() == set()
    wait_for(lambda: not pid_exists(second_pid))
    wait_for(lambda: manager.status(key) is None)


def test_instance_stuck_in_user_code_is_killed_after_the_stop_timeout(
    client: pulsar.Client,
    start_manager: StartManager,
    topic: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = function_config("slow.py", inputs=[topic], output=f"{topic}-out")
    (key,) = specs = instance_specs(config)
    manager = start_manager(stop_timeout_s=1.0)
    manager.apply(specs)
    # One batch, so all three are ready together: once "first" comes out, "second" and
    # "hang" are in the instance's hands (in its chunk, or next in its queue), and "hang"
    # runs before the stop's drain ends.
    producer = client.create_producer(topic, batching_enabled=True)
    for value in ("first", "second", "hang"):
        producer.send_async(value.encode(), None)
    producer.flush()
    producer.close()
    assert values(collect(client, f"{topic}-out", 1)) == ["first"]
    pid = manager.pid(key)
    assert pid is not None

    with caplog.at_level(logging.WARNING, logger="magnetar.worker.runtime_manager"):
        started = time.monotonic()
        manager.apply({})
        assert time.monotonic() - started < 0.5  # apply does not wait for the drain
        # until its process is gone it may still take a message: its status says so
        draining = manager.status(key)
        assert draining is not None and draining.running is True
        assert draining.error == "stopping: finishing its in-flight messages"
        wait_for(lambda: not pid_exists(pid), timeout=10)
    assert "did not stop within 1 s; killing it" in caplog.text
    wait_for(lambda: manager.status(key) is None)


def test_a_restart_is_counted_once_its_new_run_has_started(
    client: pulsar.Client, start_manager: StartManager, topic: str
) -> None:
    config = function_config("slow.py", inputs=[topic], output=f"{topic}-out")
    (key,) = specs = instance_specs(config)
    manager = start_manager(stop_timeout_s=2.0)
    manager.apply(specs)
    producer = client.create_producer(topic, batching_enabled=True)
    for value in ("first", "second", "hang"):
        producer.send_async(value.encode(), None)
    producer.flush()
    producer.close()
    assert values(collect(client, f"{topic}-out", 1)) == ["first"]
    old_pid = manager.pid(key)

    assert manager.restart(key)
    # the old run drains (stuck in "hang" until it is killed): not a restart yet
    draining = manager.status(key)
    assert draining is not None and (draining.running, draining.num_restarts) == (True, 0)
    wait_for(lambda: manager.pid(key) not in (None, old_pid), timeout=15)
    assert old_pid is not None and not pid_exists(old_pid)
    status = manager.status(key)
    assert status is not None and status.num_restarts == 1


def warm_processes() -> list[int]:
    return descendants_named(os.getpid(), WARM_PROCESS_NAME)


def test_instances_start_in_warm_processes_and_the_pool_refills(
    client: pulsar.Client, broker_url: str, start_manager: StartManager, topic: str
) -> None:
    manager = start_manager(ProcessRuntime(broker_url, WORKER_ID, warm=2))
    wait_for(lambda: len(warm_processes()) == 2)
    ready = set(warm_processes())
    config = function_config(**EXCLAMATION, inputs=[topic], output=f"{topic}-out", parallelism=2)
    specs = instance_specs(config)
    manager.apply(specs)
    produce(client, topic, [f"w-{i}" for i in range(10)])

    assert sorted(values(collect(client, f"{topic}-out", 10))) == sorted(
        f"w-{i}!" for i in range(10)
    )
    # the instances run in the processes that were waiting, and two more wait in their place
    pids = {manager.pid(key) for key in specs}
    assert pids == ready
    assert set(descendants_named(os.getpid(), INSTANCE_PROCESS_NAME)) >= pids
    wait_for(lambda: len(warm_processes()) == 2)
    assert not set(warm_processes()) & pids

    manager.stop(drain=True)
    assert manager.wait(30)
    wait_for(lambda: warm_processes() == [])
    assert not any(pid_exists(pid) for pid in pids if pid is not None)


def test_without_warm_processes_each_instance_starts_on_demand(
    client: pulsar.Client, broker_url: str, start_manager: StartManager, topic: str
) -> None:
    config = function_config(**EXCLAMATION, inputs=[topic], output=f"{topic}-out")
    specs = instance_specs(config)
    manager = start_manager(ProcessRuntime(broker_url, WORKER_ID, warm=0))
    manager.apply(specs)
    produce(client, topic, ["a", "b"])

    assert values(collect(client, f"{topic}-out", 2)) == ["a!", "b!"]
    assert warm_processes() == []
    with pytest.raises(ValueError, match="warm must be 0 or more"):
        ProcessRuntime(broker_url, WORKER_ID, warm=-1)


def test_thread_runtime_runs_and_stops_an_instance(
    client: pulsar.Client, broker_url: str, start_manager: StartManager, topic: str
) -> None:
    config = function_config(**EXCLAMATION, inputs=[topic], output=f"{topic}-out")
    (key,) = specs = instance_specs(config)
    manager = start_manager(ThreadRuntime(client, broker_url, WORKER_ID))
    manager.apply(specs)
    produce(client, topic, ["a", "b", "c"])

    assert values(collect(client, f"{topic}-out", 3)) == ["a!", "b!", "c!"]
    wait_for(lambda: (s := manager.status(key)) is not None and s.processed == 3)
    status = manager.status(key)
    assert status is not None and status.running and status.worker_id == WORKER_ID
    assert manager.pid(key) is None

    manager.apply({})
    wait_for(lambda: manager.status(key) is None)
    thread_name = f"instance-{config.fqfn}"
    wait_for(lambda: all(t.name != thread_name for t in threading.enumerate()))


def test_thread_runtime_runs_each_function_its_own_code_of_the_same_file_name(
    client: pulsar.Client, broker_url: str, start_manager: StartManager, topic: str, tmp_path: Path
) -> None:
    """Two teams' ``shout.py`` in one worker process each run as written, and an update
    runs the new code (Python would hand both the module it imported first)."""

    def shout(directory: str, prefix: str) -> str:
        (tmp_path / directory).mkdir()
        code = tmp_path / directory / "shout.py"
        code.write_text(f"def process(value):\n    return {prefix!r} + value\n")
        return str(code)

    team_a = function_config(py=shout("a", "A:"), inputs=[f"{topic}-a"], output=f"{topic}-out")
    team_b = function_config(py=shout("b", "B:"), inputs=[f"{topic}-b"], output=f"{topic}-out")
    manager = start_manager(ThreadRuntime(client, broker_url, WORKER_ID))
    manager.apply({**instance_specs(team_a), **instance_specs(team_b)})
    produce(client, f"{topic}-a", ["x"])
    produce(client, f"{topic}-b", ["y"])
    assert sorted(values(collect(client, f"{topic}-out", 2))) == ["A:x", "B:y"]

    updated = team_a.model_copy(update={"py": shout("a2", "A2:")})
    (key,) = specs = instance_specs(updated, version=2)
    manager.apply({**specs, **instance_specs(team_b)})
    # the new run (the old one, draining, reports the input it processed)
    wait_for(lambda: (s := manager.status(key)) is not None and s.running and s.processed == 0)
    produce(client, f"{topic}-a", ["z"])
    assert values(collect(client, f"{topic}-out", 1)) == ["A2:z"]


def test_thread_runtime_refuses_javascript_functions_with_the_reason(
    client: pulsar.Client, broker_url: str, start_manager: StartManager, topic: str
) -> None:
    config = function_config(
        runtime="JAVASCRIPT", js=str(EXAMPLES / "exclamation.js"), inputs=[topic]
    )
    (key,) = specs = instance_specs(config)
    manager = start_manager(ThreadRuntime(client, broker_url, WORKER_ID))
    manager.apply(specs)

    wait_for(lambda: (s := manager.status(key)) is not None and bool(s.error))
    status = manager.status(key)
    assert status is not None and not status.running
    assert status.error == (
        "cannot start the instance: InstanceError: JavaScript functions need the process "
        "runtime (worker setting runtime: process): V8, as mini-racer embeds it, crashes or "
        "hangs a process that holds contexts on several threads, which would take every "
        "instance of the worker with it"
    )


def test_stop_drains_every_instance_and_leaves_no_child_process(
    client: pulsar.Client, start_manager: StartManager, topic: str
) -> None:
    config = function_config(**EXCLAMATION, inputs=[topic], output=f"{topic}-out", parallelism=3)
    specs = instance_specs(config)
    manager = start_manager()
    manager.apply(specs)
    produce(client, topic, [f"m-{i}" for i in range(30)])
    assert len(collect(client, f"{topic}-out", 30)) == 30
    pids = [manager.pid(key) for key in specs]

    manager.stop(drain=True)
    assert manager.wait(30)
    assert manager.statuses() == {}
    assert not any(pid_exists(pid) for pid in pids if pid is not None)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("magnetar")]


_WORKER_SCRIPT = """
import sys, time
from magnetar.instance import FunctionConfig
from magnetar.worker.runtime import InstanceSpec, ProcessRuntime
from magnetar.worker.runtime_manager import RuntimeManager

if __name__ == "__main__":
    config = FunctionConfig.model_validate_json(sys.argv[2])
    spec = InstanceSpec(config.fqfn, 0, config, 1)
    manager = RuntimeManager(ProcessRuntime(sys.argv[1], "doomed"), "doomed").start()
    manager.apply({spec.key: spec})
    while manager.pid(spec.key) is None:
        time.sleep(0.05)
    print(manager.pid(spec.key), flush=True)
    time.sleep(120)
"""


def test_instances_of_a_killed_worker_stop_instead_of_running_orphaned(
    broker_url: str, client: pulsar.Client, topic: str, tmp_path: Path
) -> None:
    config = function_config(**EXCLAMATION, inputs=[topic], output=f"{topic}-out")
    script = tmp_path / "worker.py"
    script.write_text(_WORKER_SCRIPT)
    worker = subprocess.Popen(
        [sys.executable, str(script), broker_url, config.model_dump_json(by_alias=True)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        instance_pid = int(worker.stdout.readline())
        produce(client, topic, ["alive"])
        assert values(collect(client, f"{topic}-out", 1)) == ["alive!"]
        wait_for(lambda: len(descendants_named(worker.pid, WARM_PROCESS_NAME)) == 2)
        warm = descendants_named(worker.pid, WARM_PROCESS_NAME)
    finally:
        worker.kill()
        worker.wait()
    wait_for(lambda: not pid_exists(instance_pid), timeout=10)
    # the processes kept warm for it notice as well, and exit
    wait_for(lambda: not any(pid_exists(pid) for pid in warm), timeout=10)


def test_restart_backoff_grows_to_its_maximum() -> None:
    policy = BackoffPolicy()
    assert [policy.delay(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    with pytest.raises(ValueError, match="multiplier"):
        BackoffPolicy(multiplier=0.5)


def test_make_runtime_names_the_accepted_runtimes(broker_url: str) -> None:
    assert isinstance(make_runtime("process", broker_url=broker_url, worker_id="w"), ProcessRuntime)
    with pytest.raises(ValueError, match="pulsar client"):
        make_runtime("thread", broker_url=broker_url, worker_id="w")
    with pytest.raises(ValueError, match="process, thread"):
        make_runtime("docker", broker_url=broker_url, worker_id="w")


def test_apply_rejects_a_key_that_does_not_match_its_spec(start_manager: StartManager) -> None:
    spec = next(iter(instance_specs(function_config(**EXCLAMATION, inputs=["in"])).values()))
    other = InstanceSpec(spec.fqfn, 1, spec.config, spec.version)
    manager = start_manager()
    with pytest.raises(ValueError, match="does not match"):
        manager.apply({spec.key: other})


def test_a_package_past_the_workers_unpacking_limit_fails_its_instance_naming_the_limit(
    broker_url: str, start_manager: StartManager, topic: str, tmp_path: Path
) -> None:
    # its directory declares 100 bytes for 8 MiB of zeros: only unpacking finds out
    code = (EXAMPLES / "exclamation.py").read_bytes()
    package = tmp_path / "exclamation.zip"
    package.write_bytes(
        lying_zip({"exclamation.py": code, "zeros.bin": bytes(8 << 20)}, "zeros.bin", 100)
    )
    limits = ArchiveLimits(max_unpacked_bytes=1 << 20, max_compression_ratio=1e9)
    runtime = ProcessRuntime(broker_url, WORKER_ID, warm=0, archive_limits=limits)
    specs = instance_specs(
        function_config(py=str(package), class_name=EXCLAMATION["class_name"], inputs=[topic])
    )
    (key,) = specs
    manager = start_manager(runtime, liveness_interval_s=0.1)
    manager.apply(specs)

    deadline = time.monotonic() + 20
    while not ((status := manager.status(key)) and status.error):
        assert time.monotonic() < deadline, "the instance reported no error"
        time.sleep(0.05)
    assert not status.running
    assert "max_package_unpacked_bytes" in status.error, status.error
    assert f"more than {1 << 20} bytes" in status.error
