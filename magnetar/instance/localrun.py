"""localrun: run a function's instances on this machine, without a worker cluster.

Each instance runs in a process of its own (as the worker's process runtime will), on that
process's main thread, so ``timeoutMs`` can interrupt a runaway invocation and instances use
all cores. The parent supervises: it reports progress, and on Ctrl-C / SIGTERM it asks every
instance to stop gracefully (finish in-flight messages, flush, acknowledge) before it exits.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from magnetar.broker_probe import check_broker
from magnetar.client import Connection
from magnetar.instance.config import FunctionConfig
from magnetar.instance.exceptions import InstanceError
from magnetar.instance.loader import load_function
from magnetar.instance.metrics import MetricsSnapshot
from magnetar.instance.process import (
    InstanceExit,
    InstanceProcessSpec,
    run_instance_process,
    signals_blocked,
)
from magnetar.instance.secrets import load_secrets_provider
from magnetar.instance.url_hosts import ANY_HOST
from magnetar.instance.windowing.extractors import load_timestamp_extractor
from magnetar.statestore import StateOptions, instance_state_dir

__all__ = ["LocalRun"]

log = logging.getLogger(__name__)

_STOP_GRACE_S = 45.0


class LocalRun:
    """The instances of one function, each in its own process, reporting to this one."""

    def __init__(
        self,
        config: FunctionConfig,
        broker_url: str,
        on_metrics: Callable[[dict[int, MetricsSnapshot]], None] | None = None,
        report_interval_s: float = 5.0,
        state_dir: Path | None = None,
        connection: Connection | None = None,
        secrets_provider: tuple[str | None, Any] = (None, None),
        instance_id_offset: int = 0,
    ) -> None:
        """``state_dir``: where the instances keep their state databases (a directory per
        instance), None runs them without a state store; ``secrets_provider``: its class
        name and the config its ``init`` is given; instance ids start at
        ``instance_id_offset``."""
        self.config = config
        self.broker_url = broker_url
        self._connection = connection
        self._secrets_provider = secrets_provider
        self._instance_ids = range(instance_id_offset, instance_id_offset + config.parallelism)
        self._on_metrics = on_metrics
        self._report_interval_s = report_interval_s
        self._state_dir = state_dir
        self._stop = threading.Event()
        self._force = False
        self._processes: dict[int, multiprocessing.process.BaseProcess] = {}
        self.snapshots: dict[int, MetricsSnapshot] = {}
        self.errors: dict[int, str] = {}

    def check(self) -> None:
        """Load the code and reach the broker once here, so a bad --py/--js file or a wrong
        URL is reported before any instance starts."""
        if self.config.is_javascript:
            from magnetar.instance.javascript import check_script_file

            check_script_file(self.config)
        elif not self.config.py:
            raise InstanceError(
                "no function code: pass --py FILE (a .py file or a .zip) or --js FILE"
            )
        else:
            function = load_function(self.config.py, self.config.class_name)
            load_secrets_provider(*self._secrets_provider, function.search_paths)
            window = self.config.window_config
            if window is not None and window.timestamp_extractor_class_name:
                load_timestamp_extractor(
                    window.timestamp_extractor_class_name, function.search_paths
                )
        try:
            check_broker(self.broker_url)
        except ValueError as error:
            raise InstanceError(str(error)) from None

    def stop(self) -> None:
        """Ask every instance to stop gracefully; asked again, kill them (safe from a
        signal handler, so a second Ctrl-C ends a function stuck in user code)."""
        if self._stop.is_set():
            self._force = True
        self._stop.set()

    def run(self) -> int:
        """Run until every instance exits or ``stop()``; the exit code (0: clean)."""
        context = multiprocessing.get_context("spawn")
        reports = context.Queue()
        config_json = self.config.model_dump_json(by_alias=True, exclude_none=True)
        level = logging.getLogger().getEffectiveLevel()
        classname, provider_config = self._secrets_provider
        with signals_blocked():  # a Ctrl-C now waits until the children can take it
            for instance_id in self._instance_ids:
                spec = InstanceProcessSpec(
                    config_json,
                    self.broker_url,
                    instance_id,
                    level,
                    state=self._state(instance_id),
                    connection=self._connection,
                    secrets_provider_classname=classname,
                    secrets_provider_config=provider_config,
                    # the user's own code on the user's own machine: any host
                    url_hosts=ANY_HOST,
                )
                child = context.Process(
                    target=run_instance_process,
                    args=(spec, reports),
                    name=f"{self.config.fqfn}:{instance_id}",
                )
                child.start()
                self._processes[instance_id] = child
        exited: set[int] = set()
        next_report = time.monotonic() + self._report_interval_s
        stop_sent_at: float | None = None
        while len(exited) < len(self._processes):
            if self._stop.is_set() and stop_sent_at is None:
                stop_sent_at = time.monotonic()
                self._signal_all(signal.SIGTERM)
            if stop_sent_at is not None and (
                self._force or time.monotonic() - stop_sent_at > _STOP_GRACE_S
            ):
                log.warning(
                    "killing the instances: %s",
                    "asked twice"
                    if self._force
                    else f"they did not stop within {_STOP_GRACE_S:.0f}s",
                )
                self._signal_all(signal.SIGKILL)
                break
            try:
                report = reports.get(timeout=0.2)
            except queue.Empty:
                report = None
            if isinstance(report, MetricsSnapshot):
                self.snapshots[report.instance_id] = report
            elif isinstance(report, InstanceExit):
                exited.add(report.instance_id)
                if report.error:
                    self.errors[report.instance_id] = report.error
                    if not self._stop.is_set():
                        self._stop.set()
            for instance_id, process in self._processes.items():
                if instance_id not in exited and not process.is_alive():
                    exited.add(instance_id)
                    self.errors.setdefault(
                        instance_id, f"instance process exited with code {process.exitcode}"
                    )
                    self._stop.set()
            if self._on_metrics is not None and time.monotonic() >= next_report:
                self._on_metrics(dict(self.snapshots))
                next_report = time.monotonic() + self._report_interval_s
        for instance_id, process in self._processes.items():
            process.join(5)
            if instance_id not in exited:
                self.errors.setdefault(
                    instance_id, f"instance killed (exit code {process.exitcode})"
                )
        self._drain_reports(reports)
        return 1 if self.errors else 0

    def _state(self, instance_id: int) -> StateOptions | None:
        if self._state_dir is None:
            return None
        return StateOptions(str(instance_state_dir(self._state_dir, self.config.fqfn, instance_id)))

    def _drain_reports(self, reports: Any) -> None:
        while True:
            try:
                report = reports.get_nowait()
            except (queue.Empty, OSError, ValueError):
                return
            if isinstance(report, MetricsSnapshot):
                self.snapshots[report.instance_id] = report

    def _signal_all(self, signum: int) -> None:
        for process in self._processes.values():
            if process.pid is not None and process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)
