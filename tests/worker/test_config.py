"""WorkerConfig from a YAML file, MAGNETAR_* variables and flags, in that precedence."""

from __future__ import annotations

from pathlib import Path

import pytest

from magnetar.worker.admission import AdmissionLimits
from magnetar.worker.config import load_worker_config
from magnetar.worker.exceptions import WorkerConfigError


def test_file_then_environment_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "worker.yaml"
    path.write_text(
        "worker-id: from-file\nhttp_port: 9000\nscheduler: round-robin\n"
        "heartbeat_interval_s: 0.25\n"
    )
    monkeypatch.setenv("MAGNETAR_HTTP_PORT", "9100")
    monkeypatch.setenv("MAGNETAR_RUNTIME", "thread")
    config = load_worker_config(path, worker_id="from-flag", broker_url=None)
    assert config.worker_id == "from-flag"
    assert config.http_port == 9100
    assert config.runtime == "thread"
    assert config.scheduler == "round-robin"
    assert config.heartbeat_interval_s == 0.25
    assert config.admin_url == "http://127.0.0.1:9100"
    assert config.system_topic("metadata") == "persistent://public/magnetar/metadata"


def test_bad_values_name_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAGNETAR_RUNTIME", "docker")
    with pytest.raises(WorkerConfigError, match="runtime"):
        load_worker_config()
    monkeypatch.delenv("MAGNETAR_RUNTIME")
    path = tmp_path / "worker.yaml"
    path.write_text("surprise: 1\n")
    with pytest.raises(WorkerConfigError, match="surprise: Extra inputs are not permitted"):
        load_worker_config(path)
    path.write_text("- a list\n")
    with pytest.raises(WorkerConfigError, match="must be a mapping"):
        load_worker_config(path)


def test_admission_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAGNETAR_MAX_PARALLELISM", "8")
    monkeypatch.setenv("MAGNETAR_MAX_INSTANCES_PER_WORKER", "20")
    monkeypatch.setenv("MAGNETAR_MAX_INSTANCES_PER_TENANT", "12")
    monkeypatch.setenv("MAGNETAR_MAX_PACKAGE_UNPACKED_BYTES", "1048576")
    limits = AdmissionLimits.of(load_worker_config())
    assert (limits.max_parallelism, limits.max_instances_per_worker) == (8, 20)
    assert limits.max_instances_per_tenant == 12
    assert limits.archive.max_unpacked_bytes == 1 << 20
    assert limits.max_name_length == 64 and limits.archive.max_entries == 20_000
    monkeypatch.setenv("MAGNETAR_MAX_PARALLELISM", "0")
    with pytest.raises(WorkerConfigError, match="max_parallelism: Input should be greater than"):
        load_worker_config()


def test_instance_limits_have_defaults_and_name_a_bad_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_worker_config(data_dir=tmp_path)
    assert config.instance_ram_bytes == 1024**3
    assert (config.shutdown_timeout_s, config.instance_stop_timeout_s) == (5.0, 10.0)
    assert config.instance_log_dir == tmp_path / "logs"
    assert config.instance_cpu_limits and config.instance_memory_limits
    monkeypatch.setenv("MAGNETAR_INSTANCE_RAM_BYTES", "268435456")
    monkeypatch.setenv("MAGNETAR_SHUTDOWN_TIMEOUT_S", "2")
    monkeypatch.setenv("MAGNETAR_INSTANCE_MEMORY_LIMITS", "false")
    config = load_worker_config()
    assert (config.instance_ram_bytes, config.shutdown_timeout_s) == (268435456, 2.0)
    assert not config.instance_memory_limits
    monkeypatch.setenv("MAGNETAR_INSTANCE_RAM_BYTES", "-1")
    with pytest.raises(WorkerConfigError, match="instance_ram_bytes"):
        load_worker_config()
