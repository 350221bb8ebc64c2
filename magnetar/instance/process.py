"""An instance in a process of its own: the entry point localrun and the worker's process
runtime start, and what it reports back.

Running on the process's main thread lets ``timeoutMs`` interrupt a runaway invocation;
SIGTERM and SIGINT stop the instance gracefully. The parent starts the process with both
signals blocked (see ``signals_blocked``), so one that arrives while the interpreter is still
starting waits, instead of killing the process or raising KeyboardInterrupt in an import, and
is handled once the handlers are in place. Reports go through a multiprocessing queue: a
``MetricsSnapshot`` every ``metrics_interval_s`` and an ``InstanceExit`` last.

A process may connect to the broker before it knows which instance it will run (the worker
keeps such warm processes ready) and hand that client to ``run_instance_process``.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from magnetar.instance.archive import DEFAULT_ARCHIVE_LIMITS, ArchiveLimits
from magnetar.instance.publish_policy import ANYWHERE, PublishPolicy
from magnetar.instance.url_hosts import PUBLIC_HOSTS, UrlHostRule

if TYPE_CHECKING:
    import pulsar

    from magnetar.client import Connection
    from magnetar.instance.privileges import InstanceUser
    from magnetar.statestore import StateOptions

__all__ = [
    "InstanceExit",
    "InstanceProcessSpec",
    "limit_data",
    "run_instance_process",
    "signals_blocked",
]

_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@dataclass(frozen=True)
class InstanceProcessSpec:
    """Everything an instance process needs (picklable)."""

    config_json: str
    """The FunctionConfig as JSON."""
    broker_url: str
    """Pulsar service URL."""
    instance_id: int
    """Index of the instance among the function's instances."""
    log_level: int = logging.INFO
    """Level of the process log."""
    worker_id: str = ""
    """The worker running the instance (in its status)."""
    function_version: str = ""
    """Version of the function, as the context reports it."""
    metrics_interval_s: float = 1.0
    """How often a MetricsSnapshot is reported."""
    state: StateOptions | None = None
    """Where the instance keeps its state; None runs it without a state store."""
    connection: Connection | None = None
    """How the client authenticates and secures its connection."""
    secrets_provider_classname: str | None = None
    """The secrets provider (Apache's default when None)."""
    secrets_provider_config: Any = None
    """What the secrets provider's ``init`` is given."""
    archive_limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS
    """How much the code package may unpack to."""
    in_flight_path: str | None = None
    """Where the message in user code is recorded, for the worker to read (see
    ``magnetar.instance.in_flight``)."""
    earlier_crashes: dict[str, int] = field(default_factory=dict)
    """Messages earlier processes of this instance died on, and how often."""
    log_path: str | None = None
    """The instance's own log file (stdout, stderr and logging, rotated; see
    ``instance_log``); None: the process's stderr."""
    log_max_bytes: int = 10 * 1024 * 1024
    """Size at which the log file rolls over."""
    log_backups: int = 2
    """Rolled-over log files kept."""
    ram_bytes: int | None = None
    """The instance's ``resources.ram``: Python allocations beyond it (and what the process
    held before running the function) fail with MemoryError; None: no limit."""
    user: InstanceUser | None = None
    """The OS user the process runs as and its directory (already taken by the process
    runtime before this runs); None: the starter's user, the code unpacked beside it."""
    publish_policy: PublishPolicy = ANYWHERE
    """Where ``context.publish`` may reach."""
    url_hosts: UrlHostRule = PUBLIC_HOSTS
    """Where the function's URL bindings may connect."""


@dataclass(frozen=True)
class InstanceExit:
    """The last report of an instance process; ``error`` is empty after a clean stop."""

    instance_id: int
    error: str


_DATA_HEADROOM_BYTES = 64 * 1024 * 1024
"""Beyond the limit: the stacks of threads the client and the state store start later."""


def limit_data(ram_bytes: int) -> None:
    """Hold this process's data (heap, anonymous mappings, thread stacks) to what it uses now
    plus ``ram_bytes``: an allocation beyond fails (MemoryError in Python) instead of growing
    the worker's machine out of memory. The worker also kills an instance whose resident size
    passes ``ram_bytes``; this limit is the backstop for an allocation faster than its checks.
    V8 keeps a JavaScript function's heap to its own limit, so JavaScript instances are not
    limited here."""
    used = _data_bytes()
    if used is None:
        return
    limit = used + ram_bytes + _DATA_HEADROOM_BYTES
    with contextlib.suppress(ValueError, OSError):  # e.g. a lower hard limit: keep it
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _data_bytes() -> int | None:
    """This process's data size (``VmData``), None where /proc does not say."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@contextmanager
def signals_blocked() -> Iterator[None]:
    """Block SIGINT and SIGTERM while processes are started: they inherit the mask, and this
    process handles what arrived meanwhile when it ends."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def run_instance_process(
    spec: InstanceProcessSpec, reports: Any, client: pulsar.Client | None = None
) -> None:
    """Run one instance until SIGTERM/SIGINT; ``reports`` is a multiprocessing queue.

    ``client``: a client this process created earlier for ``spec.broker_url`` (a warm
    process); None creates one. Either way the instance owns it and closes it at the end.
    """
    stopping = threading.Event()
    instance: Any = None

    def stop(signum: int, frame: Any) -> None:
        stopping.set()
        if instance is not None:
            instance.stop(drain=True)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # what waited is handled now

    from magnetar.client import create_client
    from magnetar.instance.broker_options import for_broker
    from magnetar.instance.config import FunctionConfig, ProcessingGuarantees
    from magnetar.instance.instance import FunctionInstance, InstanceOptions

    log_format = f"%(asctime)s [instance {spec.instance_id}] %(levelname)s %(name)s: %(message)s"
    if spec.log_path is not None:
        from pathlib import Path

        from magnetar.instance.instance_log import InstanceLog

        InstanceLog(
            Path(spec.log_path), spec.log_level, log_format, spec.log_max_bytes, spec.log_backups
        )
    else:
        logging.basicConfig(level=spec.log_level, format=log_format)
    error = ""
    state = None
    try:
        config = FunctionConfig.model_validate_json(spec.config_json)
        if client is None:
            client = create_client(spec.broker_url, connection=spec.connection)
        if spec.ram_bytes is not None and not config.is_javascript:
            limit_data(spec.ram_bytes)  # once the client's threads are started
        options = InstanceOptions(
            instance_id=spec.instance_id,
            metrics_interval_s=spec.metrics_interval_s,
            worker_id=spec.worker_id,
            function_version=spec.function_version,
            secrets_provider_classname=spec.secrets_provider_classname,
            secrets_provider_config=spec.secrets_provider_config,
            archive_limits=spec.archive_limits,
            in_flight_path=spec.in_flight_path,
            earlier_crashes=spec.earlier_crashes,
            publish_policy=spec.publish_policy,
            url_hosts=spec.url_hosts,
        )
        options = for_broker(options, config, spec.broker_url)
        if spec.state is not None:
            from magnetar.statestore import JournaledStateStore

            state = JournaledStateStore(
                client,
                config.fqfn,
                spec.state,
                effectively_once=(
                    config.processing_guarantees is ProcessingGuarantees.EFFECTIVELY_ONCE
                ),
            )
        instance = FunctionInstance(
            config,
            client,
            options,
            state=state,
            on_metrics=reports.put,
            work_dir=spec.user.work_dir / "code" if spec.user is not None else None,
        )
        if not stopping.is_set():  # a stop that came during start-up ends it here
            instance.run()
    except Exception as failure:
        error = f"{type(failure).__name__}: {failure}"
    finally:
        try:
            if state is not None:
                state.close()
            if client is not None:
                client.close()  # may fail (no memory left for its threads): still report
        finally:
            reports.put(InstanceExit(spec.instance_id, error))
