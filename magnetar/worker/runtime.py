"""Runtimes: how the worker runs one function instance (the seam under the runtime manager).

A ``Runtime`` starts an instance from an ``InstanceSpec`` and hands back a ``RuntimeHandle``
to stop, watch and query it. Two implementations:

* ``ProcessRuntime`` (the default): one OS process per instance, forked from a fork server
  that has imported the instance's modules once, and kept warm: a few processes wait,
  connected to the broker, for the next instance to run. The instance runs on its process's
  main thread, so ``timeoutMs`` is enforced, a crash or a leak in user code stays inside it,
  and instances use all cores. Reports (metrics snapshots, the final exit) come back over a
  pipe that the handle reads whenever it is asked something; the runtime manager asks every
  liveness interval (a pipe left unread for minutes would make the instance wait on its next
  report). The same pipe is the instance's lifeline: when the worker dies, its instances
  drain and exit. On a worker running as root each instance process becomes a user of its
  own, in a directory of its own, before it loads the function (``worker.isolation``,
  ``instance.privileges``); it connects with its function's credentials, not the worker's.
* ``ThreadRuntime``: a ``FunctionInstance`` on a thread of the worker process. Cheaper to
  start, but ``timeoutMs`` cannot be enforced (SIGALRM only interrupts the main thread), a
  thread cannot be killed, and user code shares the worker's memory and GIL.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import pickle
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection as _Pipe
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Protocol

import pulsar

from magnetar.client import Connection, create_client
from magnetar.instance import sandbox
from magnetar.instance.archive import DEFAULT_ARCHIVE_LIMITS, ArchiveLimits
from magnetar.instance.broker_options import for_broker
from magnetar.instance.config import FunctionConfig, ProcessingGuarantees
from magnetar.instance.exceptions import InstanceError
from magnetar.instance.in_flight import InFlight, read_in_flight
from magnetar.instance.instance import FunctionInstance, InstanceOptions
from magnetar.instance.instance_log import instance_log_path
from magnetar.instance.metrics import MetricsSnapshot
from magnetar.instance.privileges import drop_privileges, instance_environment, scope_early
from magnetar.instance.process import InstanceExit, InstanceProcessSpec, run_instance_process
from magnetar.instance.publish_policy import ANYWHERE, PublishPolicy
from magnetar.instance.url_hosts import PUBLIC_HOSTS, UrlHostRule
from magnetar.statestore import JournaledStateStore, StateOptions, instance_state_dir
from magnetar.worker.cpu_limits import CpuLimits
from magnetar.worker.disk_limits import DiskUsage, DiskWatch
from magnetar.worker.function_config import DEFAULT_RESOURCES
from magnetar.worker.in_flight_files import InFlightFiles
from magnetar.worker.isolation import InstanceIsolation
from magnetar.worker.memory_limits import MemoryLimits, hard_limit
from magnetar.worker.model import instance_key

__all__ = [
    "INSTANCE_PROCESS_NAME",
    "RUNTIMES",
    "WARM_PROCESS_NAME",
    "InstanceLogs",
    "InstanceSpec",
    "ProcessRuntime",
    "Runtime",
    "RuntimeHandle",
    "StateLayout",
    "ThreadRuntime",
    "make_runtime",
]

log = logging.getLogger(__name__)

RUNTIMES = ("process", "thread")
"""The names ``make_runtime`` accepts; the first is the default."""


@dataclass(frozen=True)
class InstanceSpec:
    """One instance this worker should run; a different version or config means restart."""

    fqfn: str
    """``tenant/namespace/name`` of the function."""
    instance_id: int
    """Index of the instance among the function's ``parallelism`` instances."""
    config: FunctionConfig
    """The function's config; its ``py`` (``js`` for JavaScript) names the code file on this
    worker's disk."""
    version: int
    """Version of the function record the spec comes from."""
    earlier_crashes: Mapping[str, int] = field(default_factory=dict, compare=False)
    """Messages earlier runs of this instance died on (``message_key`` -> deaths): the run
    fails them on receipt (retry, then dead letter). Not part of what the instance is."""
    connection: Connection | None = None
    """How the instance authenticates to the broker: its function's own credentials (None:
    without any, as with authentication off)."""
    publish_policy: PublishPolicy = ANYWHERE
    """Where its ``context.publish`` may reach."""
    role: str | None = None
    """The role ``connection`` authenticates as (None without credentials): the broker
    grants it the function's state topics."""

    @property
    def key(self) -> str:
        """The instance key used in assignments: ``tenant/namespace/name:instance_id``."""
        return instance_key(self.fqfn, self.instance_id)


class RuntimeHandle(Protocol):
    """A started instance, as its runtime lets the worker control and observe it."""

    @property
    def pid(self) -> int | None:
        """The instance's OS process; None when it runs on a thread of the worker."""
        ...

    def stop(self, drain: bool = True) -> None:
        """Ask the instance to stop (returns at once); ``drain`` finishes in-flight messages."""
        ...

    def wait(self, timeout: float) -> bool:
        """Wait until the instance has exited; False on timeout."""
        ...

    def kill(self) -> None:
        """End the instance now; unacknowledged inputs are redelivered to another consumer."""
        ...

    def is_alive(self) -> bool:
        """Whether the instance is still running (or still starting)."""
        ...

    def snapshot(self) -> MetricsSnapshot | None:
        """The latest metrics the instance reported; None before its first report."""
        ...

    def exit_error(self) -> str:
        """Why the instance exited; '' while it runs or after a clean stop."""
        ...

    def in_flight(self) -> list[InFlight]:
        """The messages the instance has in user code, oldest first (after an exit: had, when
        it died); none when the runtime cannot tell."""
        ...

    def enforce_limits(self) -> None:
        """Kill the instance if it is over its limits (``exit_error`` then says which)."""
        ...


class Runtime(Protocol):
    """Starts function instances; the runtime manager decides which and when."""

    def prepare(self) -> None:
        """Get ready to start instances quickly (returns at once)."""
        ...

    def close(self) -> None:
        """Release what ``prepare`` set up; the instances started are not affected."""
        ...

    def start(self, spec: InstanceSpec) -> RuntimeHandle:
        """Start one instance and return at once (or once subscribed, for threads).

        Failures of the function itself (bad code, unreachable topics) are not raised: the
        handle reports them through ``is_alive()`` and ``exit_error()``.
        """
        ...


@dataclass(frozen=True)
class StateLayout:
    """Where this worker's instances keep their state: a RocksDB directory per instance
    (one process per database) under ``root``, journals in ``namespace``."""

    root: Path
    namespace: str

    def options(self, spec: InstanceSpec) -> StateOptions:
        """The state options of one instance; the function's version is its epoch."""
        directory = instance_state_dir(self.root, spec.fqfn, spec.instance_id)
        return StateOptions(str(directory), self.namespace, epoch=spec.version)


@dataclass(frozen=True)
class InstanceLogs:
    """Each instance's own rotated log file, under ``root`` (see ``instance_log``), or in
    its own directory when it is isolated (the only place its user may write)."""

    root: Path
    max_bytes: int = 10 * 1024 * 1024
    backups: int = 2
    isolation: InstanceIsolation | None = None

    def path(self, fqfn: str, instance_id: int) -> Path:
        if self.isolation is not None:
            _, _, name = fqfn.split("/")
            return self.isolation.work_dir(fqfn, instance_id) / "logs" / f"{name}-{instance_id}.log"
        return instance_log_path(self.root, fqfn, instance_id)

    def spec_fields(self, spec: InstanceSpec) -> dict[str, Any]:
        path = self.path(spec.fqfn, spec.instance_id)
        return {"log_path": str(path), "log_max_bytes": self.max_bytes, "log_backups": self.backups}


# --- process runtime ------------------------------------------------------------------------


_OVER_LIMIT_GRACE_S = 2.0
"""How long an instance over its memory or disk limit may take to stop before it is killed."""

_ORPHAN_GRACE_S = 10.0
"""How long an instance whose worker died may drain before it exits anyway."""

INSTANCE_PROCESS_NAME = "magnetar-inst"
"""What ``ps`` (and /proc/<pid>/comm) calls an instance process once it runs an instance."""
WARM_PROCESS_NAME = "magnetar-warm"
"""... and while it waits, warm, for an instance to run."""

_PR_SET_NAME = 15
_PRCTL = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None

_PRELOADED = (
    "magnetar.worker.runtime",
    "magnetar.statestore",
    "magnetar.instance.instance",
    "magnetar.instance.javascript._loader",
)
"""What the fork server imports once, so that no instance process imports it again."""


_fork_server_lock = threading.Lock()


def _start_fork_server() -> None:
    """Start multiprocessing's fork server (once per worker process) with the environment
    instances may see: a process's exec-time environment stays readable in
    /proc/<pid>/environ whatever it changes later, and every instance is forked from it."""
    with _fork_server_lock:
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(instance_environment(saved))
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)


class _WorkerPipe:
    """The instance process's end of the pipe to its worker.

    The worker writes once: the spec of the instance to run. From then on the instance
    reports through ``put``, and a read returns only when the worker is gone (end of file),
    which is how an orphaned instance notices.
    """

    def __init__(self, connection: _Pipe) -> None:
        self._connection = connection

    def receive_spec(self) -> InstanceProcessSpec | None:
        """Wait for the instance to run; None when the worker is gone or closed the pool."""
        try:
            spec = self._connection.recv()
        except (EOFError, OSError):
            return None
        return spec if isinstance(spec, InstanceProcessSpec) else None

    def put(self, report: object) -> None:
        # a failed write means the worker is gone; the lifeline thread stops the instance
        with contextlib.suppress(OSError):
            self._connection.send(report)

    def wait_for_worker_exit(self) -> None:
        """Block until the worker's end of the pipe closes."""
        with contextlib.suppress(EOFError, OSError):
            while True:
                self._connection.recv()


def _name_process(name: str) -> None:
    """Name this process as ``ps`` shows it (Linux only; at most 15 bytes): the fork server's
    children all share its command line."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]))


def _run_instance(
    broker_url: str, pipe: _WorkerPipe, preconnect: bool, isolated: bool, private: bool
) -> None:
    """The instance process. ``isolated`` (it will run as an instance user): it takes its
    namespaces and its Landlock scope first, before any thread starts (an IPC namespace too
    when ``private``: instances get views of their own). With ``preconnect`` it connects to
    the broker (with no credentials) and then waits for the spec of the instance to run, so
    a warm process only has to subscribe once it is handed one; a spec with credentials of
    its own gets a client of its own. Before anything of the function is loaded, the process
    drops what the worker's environment holds for the worker alone and, when the spec names
    a user, becomes that user. It runs ``run_instance_process`` with a lifeline to the
    worker, so an instance whose worker was killed drains and exits instead of running
    unsupervised (and twice, once its instances are rescheduled elsewhere)."""
    _name_process(WARM_PROCESS_NAME)
    # Ctrl-C reaches the whole process group: the worker decides what stops (a waiting
    # process exits when the worker closes its pipe; an instance sets its own handler).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    detached = scoped = False
    if isolated:
        with contextlib.suppress(OSError, RuntimeError):  # tried again, and told, with the spec
            sandbox.detach(ipc=private)
            detached = True
        scoped = scope_early()
    client = create_client(broker_url) if preconnect else None
    spec = pipe.receive_spec()
    if spec is None or spec.connection is not None:
        if client is not None:
            client.close()
            client = None
        if spec is None:
            return
    scrubbed = instance_environment(os.environ)
    os.environ.clear()
    os.environ.update(scrubbed)
    if spec.user is not None:
        try:
            drop_privileges(spec.user, spec.ram_bytes, detached, scoped)
        except (OSError, RuntimeError) as error:  # said in its status, like any failed start
            pipe.put(InstanceExit(spec.instance_id, f"cannot isolate the instance: {error}"))
            return
    _name_process(INSTANCE_PROCESS_NAME)

    def lifeline() -> None:
        pipe.wait_for_worker_exit()
        log.warning("the worker is gone; stopping the instance")
        os.kill(os.getpid(), signal.SIGTERM)  # the graceful stop, on the main thread
        time.sleep(_ORPHAN_GRACE_S)
        log.error("the instance did not stop within %.0f s; exiting", _ORPHAN_GRACE_S)
        os._exit(1)

    threading.Thread(target=lifeline, name="worker-lifeline", daemon=True).start()
    run_instance_process(spec, pipe, client)


class _ProcessHandle:
    """An instance process and the worker's end of its pipe."""

    def __init__(
        self,
        process: BaseProcess,
        reports: _Pipe,
        in_flight_path: str,
        ram_bytes: int | None = None,
        memory: MemoryLimits | None = None,
    ) -> None:
        """``memory``: the group the process is in (its children's memory is counted)."""
        self._process = process
        self._ram_bytes = ram_bytes
        self._memory = memory
        self._disk: tuple[DiskUsage, int, int] | None = None
        self._killed_for = ""
        self._kill_at = 0.0
        """When an instance asked to stop over a limit is killed if it has not stopped."""
        self._reports: _Pipe | None = reports
        self._on_exit: list[Callable[[], None]] = []
        self._in_flight_path = in_flight_path
        self._last_in_flight: list[InFlight] = []
        self._in_flight_read = False
        self._lock = threading.Lock()
        self._snapshot: MetricsSnapshot | None = None
        self._exit: InstanceExit | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def on_exit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once, when the process is first seen dead (callbacks run in the
        order given)."""
        self._on_exit.append(callback)

    def stop(self, drain: bool = True) -> None:
        # The instance process drains on SIGTERM; it has no "stop without draining", so
        # that is a kill: its unacknowledged inputs are redelivered.
        if drain:
            self._process.terminate()
        else:
            self._process.kill()

    def kill(self) -> None:
        self._process.kill()

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if not self.is_alive():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            # Wakes on a report (read it, so a full pipe never blocks the instance) or exit.
            ready: list[Any] = [self._process.sentinel]
            if self._reports is not None:
                ready.append(self._reports)
            wait(ready, remaining)

    def is_alive(self) -> bool:
        alive = self._process.is_alive()  # also reaps an exited process
        # read after the check: once it is seen dead, everything it reported has been read
        self._read_reports()
        if not alive and self._on_exit:
            self._note_out_of_memory()  # before the callbacks release its group
            callbacks, self._on_exit = self._on_exit, []
            for callback in callbacks:
                callback()
        return alive

    def snapshot(self) -> MetricsSnapshot | None:
        alive = self.is_alive()
        snapshot = self._snapshot
        if snapshot is not None and snapshot.running and not alive:
            # killed before it could report that it stopped
            snapshot = replace(snapshot, running=False)
        return snapshot

    def exit_error(self) -> str:
        if self.is_alive():
            return ""
        if self._killed_for:
            return self._killed_for
        if self._exit is not None:
            return self._exit.error
        code = self._process.exitcode
        if code is None or code == 0:
            return ""
        if code < 0:
            return f"the instance process was killed by {signal.Signals(-code).name}"
        return f"the instance process exited with code {code}"

    def limit_disk(self, usage: DiskUsage, max_bytes: int, max_files: int) -> None:
        """Stop the instance once ``usage`` (of its directory) passes ``max_bytes`` or
        ``max_files``."""
        self._disk = (usage, max_bytes, max_files)

    def enforce_limits(self) -> None:
        if self._killed_for:
            if time.monotonic() >= self._kill_at:
                self._process.kill()
            return
        over = self._over_memory() or self._over_disk()
        if over:
            self._killed_for = over
            # Stopped, then killed if it has not stopped within the grace (meanwhile a Python
            # function's data is held by RLIMIT_DATA, a JavaScript one's by its V8 heap
            # limit). Stopped, it acknowledges what it finished; killed outright, every input
            # it had answered is handed to its next process again, and a kill while the
            # broker writes to it leaves its consumers behind on pulsar-lite, whose healer
            # then restarts the broker under every other function (see broker_healer).
            self._kill_at = time.monotonic() + _OVER_LIMIT_GRACE_S
            self._process.terminate()

    def _over_memory(self) -> str:
        ram, pid = self._ram_bytes, self._process.pid
        if ram is None or pid is None:
            return ""
        resident = _resident_bytes(pid)
        if self._memory is not None:  # with what it started, and its /tmp
            resident = max(resident or 0, self._memory.used(pid) or 0)
        if resident is not None and resident > ram:
            return f"out of memory: over resources.ram {ram} bytes (it held {resident} bytes)"
        return ""

    def _over_disk(self) -> str:
        if self._disk is None:
            return ""
        usage, max_bytes, max_files = self._disk
        if usage.files > max_files:
            return (
                f"out of disk: its directory holds more than {max_files} files (instance_max_files)"
            )
        if usage.bytes > max_bytes:
            return (
                f"out of disk: over resources.disk {max_bytes} bytes (its directory held "
                f"{usage.bytes} bytes)"
            )
        return ""

    def _note_out_of_memory(self) -> None:
        """An instance the kernel killed over its group's memory limit: out of memory."""
        memory, pid, ram = self._memory, self._process.pid, self._ram_bytes
        if memory is None or pid is None or ram is None or self._killed_for:
            return
        if self._process.exitcode == -signal.SIGKILL and memory.oom_kills(pid):
            self._killed_for = (
                f"out of memory: over resources.ram {ram} bytes, with what it started "
                f"(killed by the kernel at {hard_limit(ram)} bytes)"
            )

    def in_flight(self) -> list[InFlight]:
        if self._in_flight_read:
            return self._last_in_flight
        alive = self.is_alive()
        in_flight = read_in_flight(self._in_flight_path)
        if not alive:  # what it held when it died: read once, the file is not needed again
            self._last_in_flight, self._in_flight_read = in_flight, True
            with contextlib.suppress(OSError):
                os.unlink(self._in_flight_path)
        return in_flight

    def _read_reports(self) -> None:
        with self._lock:
            reports = self._reports
            try:
                while reports is not None and reports.poll():
                    report = reports.recv()
                    if isinstance(report, MetricsSnapshot):
                        self._snapshot = report
                    elif isinstance(report, InstanceExit):
                        self._exit = report
            except (EOFError, OSError, pickle.UnpicklingError):
                # The process has exited (or died mid-write): nothing more will come.
                assert reports is not None
                reports.close()
                self._reports = None


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _resident_bytes(pid: int) -> int | None:
    """The resident size of a process (Linux); None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class _IdleProcess:
    """A started instance process waiting for its spec, and the worker's end of its pipe."""

    process: BaseProcess
    pipe: _Pipe


class ProcessRuntime:
    """One OS process per instance (``run_instance_process``), forked from a fork server.

    Starting a fresh interpreter per instance (the "spawn" method) costs about half a second
    of imports, more when several start at once. Instead a fork server (multiprocessing's
    "forkserver" method: a process of its own, started once, with no threads) imports the
    instance's modules once and forks every instance process from that state. On top of
    that, ``warm`` processes are kept started and connected to the broker (``prepare``), so
    an assignment only has to hand one its spec: it loads the function and subscribes.
    """

    def __init__(
        self,
        broker_url: str,
        worker_id: str,
        log_level: int = logging.INFO,
        state: StateLayout | None = None,
        warm: int = 2,
        archive_limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS,
        ram_bytes: int | None = None,
        logs: InstanceLogs | None = None,
        isolation: InstanceIsolation | None = None,
        preconnect: bool = True,
        url_hosts: UrlHostRule = PUBLIC_HOSTS,
        cpu_limits: CpuLimits | None = None,
        memory_limits: MemoryLimits | None = None,
        disk_watch: DiskWatch | None = None,
    ) -> None:
        """``warm``: processes kept ready for the next instances (0: start each on demand);
        ``archive_limits``: how much a code package may unpack to; ``ram_bytes``: the memory
        limit of an instance without ``resources.ram`` (None: none); ``logs``: where each
        instance logs (None: to the worker's stderr); ``isolation``: run each instance as a
        user of its own, in a directory of its own (the worker must be root); ``preconnect``:
        warm processes connect to the broker before they know their instance (only without
        credentials: with authentication on, an instance connects with its function's);
        ``url_hosts``: where URL bindings may connect; ``cpu_limits``: hold each instance
        to its ``resources.cpu`` (None: no limit); ``memory_limits``: count what each
        instance starts against its memory limit, and hold them to it (None: the instance's
        own process is measured alone); ``disk_watch``: measure each isolated instance's
        directory, to hold it to its ``resources.disk`` and the watch's ``max_files``."""
        if warm < 0:
            raise ValueError(f"warm must be 0 or more, got {warm}")
        self.broker_url = broker_url
        self.worker_id = worker_id
        self.log_level = log_level
        self.state = state
        self.warm = warm
        self.archive_limits = archive_limits
        self.ram_bytes = ram_bytes
        self.logs = logs
        self.isolation = isolation
        self.preconnect = preconnect
        self.url_hosts = url_hosts
        self.cpu_limits = cpu_limits
        self.memory_limits = memory_limits
        self.disk_watch = disk_watch
        # Not "fork" of the worker itself: the worker has threads (and pulsar-client's) that
        # a fork would copy in whatever state they are in. The fork server has none.
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(list(_PRELOADED))
        self._lock = threading.Lock()
        self._idle: deque[_IdleProcess] = deque()
        self._closed = False
        self._refill = threading.Event()
        self._refiller: threading.Thread | None = None
        self._in_flight_files = InFlightFiles()

    def prepare(self) -> None:
        """Start the fork server, and a thread that keeps ``warm`` processes started (one
        taken is replaced in the background: starting it is never on an instance's way)."""
        _start_fork_server()
        if self.warm and self._refiller is None:
            self._refiller = threading.Thread(
                target=self._keep_warm, name="warm-instances", daemon=True
            )
            self._refiller.start()
        self._refill.set()

    def close(self) -> None:
        """Stop the warm processes that were never handed an instance."""
        with self._lock:
            self._closed = True
        self._refill.set()
        if self._refiller is not None:
            self._refiller.join(10)
        with self._lock:
            idle, self._idle = list(self._idle), deque()
        for entry in idle:
            entry.pipe.close()  # end of file: the process exits without running anything
        for entry in idle:
            entry.process.join(5)
            if entry.process.is_alive():
                entry.process.kill()
                entry.process.join(1)
        self._in_flight_files.remove()
        if self.disk_watch is not None:
            self.disk_watch.close()

    def start(self, spec: InstanceSpec) -> RuntimeHandle:
        config, state = spec.config, self.state.options(spec) if self.state is not None else None
        user = None
        if self.isolation is not None:
            code_field = "js" if config.is_javascript else "py"
            package = Path(getattr(config, code_field))
            user = self.isolation.claim(spec.fqfn, spec.instance_id, package)
            # its own copy of the code, and its state in its own directory
            config = config.model_copy(
                update={code_field: str(user.work_dir / "package" / package.name)}
            )
            if state is not None:
                state = replace(state, directory=str(user.work_dir / "state"))
        process_spec = InstanceProcessSpec(
            config_json=config.model_dump_json(by_alias=True, exclude_none=True),
            broker_url=self.broker_url,
            instance_id=spec.instance_id,
            log_level=self.log_level,
            worker_id=self.worker_id,
            function_version=str(spec.version),
            state=state,
            connection=spec.connection,
            user=user,
            publish_policy=spec.publish_policy,
            url_hosts=self.url_hosts,
            archive_limits=self.archive_limits,
            # an isolated instance writes only inside its own directory
            in_flight_path=(
                str(user.work_dir / "in-flight")
                if user is not None
                else self._in_flight_files.next_path()
            ),
            earlier_crashes=dict(spec.earlier_crashes),
            ram_bytes=(spec.config.resources or {}).get("ram") or self.ram_bytes,
            **(self.logs.spec_fields(spec) if self.logs is not None else {}),
        )
        isolation = self.isolation
        cores = float((spec.config.resources or {}).get("cpu") or DEFAULT_RESOURCES["cpu"])
        try:
            handle = self._hand_over(process_spec, spec.key, cores)
        except BaseException:
            if isolation is not None and user is not None:
                isolation.release(user.uid)
            raise
        if isolation is not None and user is not None:
            handle.on_exit(functools.partial(isolation.release, user.uid))
            if self.disk_watch is not None:  # its directory: the one place it may write
                disk = int((spec.config.resources or {}).get("disk") or DEFAULT_RESOURCES["disk"])
                usage = self.disk_watch.watch(user.work_dir)
                handle.limit_disk(usage, disk, self.disk_watch.max_files)
                handle.on_exit(functools.partial(self.disk_watch.forget, user.work_dir))
        if handle.pid is not None:
            # after the release, which kills what the instance's user left running in them
            handle.on_exit(functools.partial(self._release_groups, handle.pid))
        self._refill.set()
        return handle

    def _hand_over(
        self, process_spec: InstanceProcessSpec, key: str, cores: float
    ) -> _ProcessHandle:
        """Give the spec to a warm process, or else to a process started for it, held to
        ``cores`` and its memory limit (with ``cpu_limits``, ``memory_limits``) before it has
        the function."""
        while True:
            with self._lock:
                entry = self._idle.popleft() if self._idle else None
            if entry is None:
                entry = self._start_process()
                if not self._give(entry, process_spec, cores):
                    # just started and gone already: a crash of the instance
                    raise InstanceError("the instance process exited as it started")
                break
            if self._give(entry, process_spec, cores):
                break  # else it died while waiting: the next one
        entry.process.name = f"magnetar-instance {key}"
        assert process_spec.in_flight_path is not None
        return _ProcessHandle(
            entry.process,
            entry.pipe,
            process_spec.in_flight_path,
            process_spec.ram_bytes,
            self.memory_limits,
        )

    def _give(self, entry: _IdleProcess, process_spec: InstanceProcessSpec, cores: float) -> bool:
        """Hold ``entry``'s process to ``cores`` and the spec's memory limit (with
        ``cpu_limits``, ``memory_limits``), then send it the spec; False if it has exited. A
        process that cannot be limited is killed (OSError)."""
        pid = entry.process.pid
        try:
            if pid is not None and self.cpu_limits is not None:
                self.cpu_limits.limit(pid, cores)
            if pid is not None and self.memory_limits is not None:
                self.memory_limits.limit(pid, process_spec.ram_bytes)
            entry.pipe.send(process_spec)
            return True
        except OSError as error:
            exited = isinstance(error, ProcessLookupError | ConnectionError)
            entry.pipe.close()
            if not exited:  # not limited: it must not run
                entry.process.kill()
            entry.process.join(1)
            if pid is not None:
                self._release_groups(pid)
            if exited:
                return False
            raise

    def _release_groups(self, pid: int) -> None:
        """Remove the cgroups of instance process ``pid``, which has exited."""
        for groups in (self.cpu_limits, self.memory_limits):
            if groups is not None:
                groups.release(pid)

    def _keep_warm(self) -> None:
        while True:
            self._refill.wait()
            self._refill.clear()
            try:
                self._replenish()
            except Exception:  # the next instance started tries again
                log.exception("starting a warm instance process failed")
            with self._lock:
                if self._closed:
                    return

    def _replenish(self) -> None:
        while True:
            with self._lock:
                if self._closed or len(self._idle) >= self.warm:
                    return
            entry = self._start_process()
            with self._lock:
                if not self._closed:
                    self._idle.append(entry)
                    continue
            entry.pipe.close()
            return

    def _start_process(self) -> _IdleProcess:
        # Duplex: the worker writes the spec; the process writes reports, and reads on
        # only to learn that the worker died.
        worker_end, process_end = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=_run_instance,
            args=(
                self.broker_url,
                _WorkerPipe(process_end),
                self.preconnect,
                self.isolation is not None,
                self.isolation is not None and self.isolation.private,
            ),
            name="magnetar-instance (warm)",
            # a worker that exits without stopping its instances still takes them along
            daemon=True,
        )
        try:
            process.start()
        except BaseException:
            worker_end.close()
            raise
        finally:
            # Only the child keeps its end, so each side sees EOF once the other has exited.
            process_end.close()
        return _IdleProcess(process, worker_end)


# --- thread runtime -------------------------------------------------------------------------


class _ThreadHandle:
    """A ``FunctionInstance`` running on a thread of the worker."""

    pid: int | None = None

    def __init__(
        self, instance: FunctionInstance, state: JournaledStateStore | None = None
    ) -> None:
        self._instance = instance
        self._state = state

    def stop(self, drain: bool = True) -> None:
        self._instance.stop(drain)

    def kill(self) -> None:
        # A thread cannot be killed: stop without draining; a thread stuck in user code
        # keeps running until that code returns.
        self._instance.stop(drain=False)

    def wait(self, timeout: float) -> bool:
        done = self._instance.wait(timeout)
        if done and self._state is not None:
            self._state.close()  # its table (if reads opened one) writes its checkpoint
            self._state = None
        return done

    def is_alive(self) -> bool:
        return not self.wait(0)

    def snapshot(self) -> MetricsSnapshot | None:
        return self._instance.snapshot()

    def exit_error(self) -> str:
        error = self._instance.error
        return "" if error is None else f"{type(error).__name__}: {error}"

    def in_flight(self) -> list[InFlight]:
        """Not recorded: a thread does not die alone."""
        return []

    def enforce_limits(self) -> None:
        """A thread's memory cannot be told from the worker's: no limit."""


_NO_V8_ON_THREADS = (
    "JavaScript functions need the process runtime (worker setting runtime: process): V8, "
    "as mini-racer embeds it, crashes or hangs a process that holds contexts on several "
    "threads, which would take every instance of the worker with it"
)


class ThreadRuntime:
    """Instances on threads of the worker process, sharing the worker's pulsar client.

    ``timeoutMs`` is not enforced here (only the main thread can be interrupted by SIGALRM),
    and ``kill()`` cannot end a thread stuck in user code: use the process runtime for
    untrusted or long-running functions.
    """

    def __init__(
        self,
        client: pulsar.Client,
        broker_url: str,
        worker_id: str,
        state: StateLayout | None = None,
        archive_limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS,
    ) -> None:
        self.client = client
        self.broker_url = broker_url
        self.worker_id = worker_id
        self.state = state
        self.archive_limits = archive_limits

    def prepare(self) -> None:
        """Nothing to prepare: a thread starts at once."""

    def close(self) -> None:
        """Nothing to release."""

    def start(self, spec: InstanceSpec) -> RuntimeHandle:
        if spec.config.is_javascript:
            raise InstanceError(_NO_V8_ON_THREADS)
        if spec.config.timeout_ms:
            log.warning(
                "%s: timeoutMs=%d is not enforced by the thread runtime",
                spec.key,
                spec.config.timeout_ms,
            )
        options = InstanceOptions(
            instance_id=spec.instance_id,
            worker_id=self.worker_id,
            function_version=str(spec.version),
            archive_limits=self.archive_limits,
            publish_policy=spec.publish_policy,
        )
        options = for_broker(options, spec.config, self.broker_url)
        state = None
        if self.state is not None:
            state = JournaledStateStore(
                self.client,
                spec.fqfn,
                self.state.options(spec),
                effectively_once=(
                    spec.config.processing_guarantees is ProcessingGuarantees.EFFECTIVELY_ONCE
                ),
            )
        instance = FunctionInstance(spec.config, self.client, options, state=state)
        try:
            instance.start()
        except Exception as error:
            # The instance records the error and is done: the handle reports it as a crash.
            log.debug("%s failed to start: %s", spec.key, error)
        return _ThreadHandle(instance, state)


def make_runtime(
    name: str,
    *,
    broker_url: str,
    worker_id: str,
    client: pulsar.Client | None = None,
    log_level: int = logging.INFO,
    state: StateLayout | None = None,
    warm: int = 2,
    archive_limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS,
    ram_bytes: int | None = None,
    logs: InstanceLogs | None = None,
    isolation: InstanceIsolation | None = None,
    preconnect: bool = True,
    url_hosts: UrlHostRule = PUBLIC_HOSTS,
    cpu_limits: CpuLimits | None = None,
    memory_limits: MemoryLimits | None = None,
    disk_watch: DiskWatch | None = None,
) -> Runtime:
    """The runtime called ``name`` ("process" or "thread"; the thread one needs ``client``);
    with ``state``, instances get a state store; ``warm``, ``archive_limits``, ``ram_bytes``,
    ``logs``, ``isolation``, ``preconnect``, ``url_hosts``, ``cpu_limits``,
    ``memory_limits`` and ``disk_watch``: see ``ProcessRuntime`` (the thread runtime cannot
    isolate: it refuses ``isolation``, limits no CPU, memory nor disk, and runs no
    JavaScript, so no URL bindings)."""
    if name == "process":
        return ProcessRuntime(
            broker_url,
            worker_id,
            log_level,
            state,
            warm,
            archive_limits,
            ram_bytes,
            logs,
            isolation,
            preconnect,
            url_hosts,
            cpu_limits,
            memory_limits,
            disk_watch,
        )
    if isolation is not None:
        raise ValueError(
            "the thread runtime runs functions inside the worker and cannot isolate them: "
            "use the process runtime, or turn instance isolation off"
        )
    if name == "thread":
        if client is None:
            raise ValueError("the thread runtime needs the worker's pulsar client")
        return ThreadRuntime(client, broker_url, worker_id, state, archive_limits)
    raise ValueError(f"unknown runtime {name!r}: choose one of {', '.join(RUNTIMES)}")
