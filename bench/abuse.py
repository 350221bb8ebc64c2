"""What abuse costs the others: a healthy function's throughput and latency, and the REST
API's, while one abuse at a time runs beside it (issue 24).

``magnetar standalone --workers 3`` (embedded pulsar-lite, the default worker settings but
``max_instances_per_worker``, lowered so that one request can pass it) runs the exclamation
example at parallelism 3, fed ``--rate`` inputs a second; each input carries its send time, so
every output gives a publish-to-output latency. A poller asks the REST API for the function
list and the healthy function's status, turn by turn on the three workers, ten times a
second. Phases of ``--phase-s`` seconds each, measured once the abuse is under way, one
abuse at a time (deleted, and the healthy backlog drained, before the next):

* ``quiet``: nothing else (the baseline, before and after the abuses: ``quiet-after``);
* ``admission``: requests refused, back to back: parallelism 10,000 and 10**23, a function
  past ``max_instances_per_worker``, a 1,000-character name, a name with a space;
* ``zip-bomb``: a package that inflates 1,000 times uploaded back to back (refused), and one
  whose directory lies about its sizes registered (its instance stops unpacking it at the
  limit, and restarts with backoff);
* ``script-checks``: JavaScript creates whose top level runs 0.5 s and throws, four at a
  time, back to back (the worker loads each script to check it, one at a time, and refuses
  it);
* ``poison``: a function that calls ``os._exit(1)`` on the input "poison" (sent once, then
  other inputs one a second), ``maxMessageRetries: 1`` and a dead-letter topic;
* ``memory-hog``: a function keeping 16 MiB more per message (5 a second), ``resources.ram``
  128 MiB;
* ``log-flood``: a function printing 4 MB per message (5 a second);
* ``stuck``: a function that sleeps an hour in one message;
* ``cpu-burn``: a function that spins for ever on its first message, parallelism 3 (a busy
  loop on each worker: 3 of them on the machine's cores).
* ``cpu-burn-limited``: the same with ``resources.cpu`` 0.25, which workers running as root
  hold each instance to (a cgroup quota, see docs/limits.md).
* ``child-hog``: a function starting a child process that holds 64 MiB per message (5 a
  second), ``resources.ram`` 128 MiB (the children count in it: a memory cgroup);
* ``shm-fill``: a function writing 16 MiB into ``/dev/shm`` per message (5 a second),
  ``resources.ram`` 128 MiB (its ``/dev/shm`` is its own tmpfs, counted in its memory);
* ``disk-fill``: a function writing 16 MiB into its directory per message (5 a second),
  ``resources.disk`` 64 MiB (measured by the worker every 10 s).

Per phase: the healthy outputs per second and their ratio to the quiet phases' mean
(target: >= 0.8), the p50/p99 publish-to-output latency, the seconds the backlog took to
drain after the phase, its duplicate outputs (an input answered twice) and the embedded
broker's restarts by its healer, the REST p50/p99 and the p99's ratio to quiet; and what the
abuse itself met (refusals, restarts, dead-lettered inputs, its status). Last, Ctrl-C (SIGINT to
the standalone's process group, as a terminal sends it) with an instance stuck in user code:
the seconds until the standalone exits (target: <= 10) and until none of its processes is left.

    python bench/abuse.py [--rate 2000] [--phase-s 15] [--warm-up 5] [--runs 1]
                          [--phases quiet,admission,...] [--json] [--output FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pulsar
from _cluster import (
    FUNCTIONS,
    READY_PATH,
    ROOT,
    Cluster,
    WorkerProcess,
    magnetar_processes_in_group,
    percentile,
    progress,
    wait_until,
)

from magnetar.broker import find_free_port
from magnetar.client import create_client

EXAMPLE = ROOT / "examples" / "exclamation.py"
WORKERS = 3
HEALTHY = "healthy"
MIB = 1 << 20
RAM_BYTES = 128 * MIB
THROUGHPUT_TARGET = 0.8
STOP_TARGET_S = 10.0
REST_POLL_S = 0.1
SETTINGS = {"MAGNETAR_MAX_INSTANCES_PER_WORKER": "10"}
"""Lowered from 100 so that one request of parallelism 50 (under ``max_parallelism``) is
refused by it: 10 x 3 workers."""

# --- the abusive functions' code ------------------------------------------------------------

POISON = """
import os
from pulsar import Function


class Poison(Function):
    def process(self, input, context):
        if input == "poison":
            os._exit(1)
        return input
"""

HOG = """
from pulsar import Function


class Hog(Function):
    def __init__(self):
        self.kept = []

    def process(self, input, context):
        self.kept.append(b"x" * (16 * 1024 * 1024))
        return str(len(self.kept))
"""

FLOOD = """
from pulsar import Function


class Flood(Function):
    def process(self, input, context):
        print("x" * 4_000_000)
        return input
"""

STUCK = """
import time
from pulsar import Function


class Stuck(Function):
    def process(self, input, context):
        time.sleep(3600)
"""

BURN = """
from pulsar import Function


class Burn(Function):
    def process(self, input, context):
        while True:
            pass
"""


CHILD_HOG = """
import subprocess
import sys

from pulsar import Function

HOLD = "import time; held = b'x' * (64 * 1024 * 1024); time.sleep(3600)"


class ChildHog(Function):
    def __init__(self):
        self.children = []

    def process(self, input, context):
        self.children.append(subprocess.Popen([sys.executable, "-c", HOLD]))
        return str(len(self.children))
"""

FILL = """
import os

from pulsar import Function


class Fill(Function):
    def __init__(self):
        self.written = 0

    def process(self, input, context):
        folder = "/dev/shm" if input == "shm" else "."
        with open(os.path.join(folder, f"fill-{self.written}"), "wb") as file:
            file.write(bytes(16 * 1024 * 1024))
        self.written += 1
        return str(self.written)
"""


def packages(work: Path) -> dict[str, Path]:
    """The abusive functions' files, written into ``work``."""
    files = {}
    for module, code in {
        "poison": POISON,
        "hog": HOG,
        "flood": FLOOD,
        "stuck": STUCK,
        "burn": BURN,
        "childhog": CHILD_HOG,
        "fill": FILL,
    }.items():
        files[module] = work / f"{module}.py"
        files[module].write_text(code)
    return files


def zip_of(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, content in entries.items():
            archive.writestr(name, content)
    return buffer.getvalue()


def lying_zip(entries: dict[str, bytes], liar: str, declared: int) -> bytes:
    """A zip whose local header and central directory both declare ``declared`` bytes for
    the entry ``liar``, whatever it inflates to."""
    data = bytearray(zip_of(entries))
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        info = archive.getinfo(liar)
    struct.pack_into("<I", data, info.header_offset + 22, declared)
    name = liar.encode()
    central = data.index(b"PK\x01\x02")
    while data[central + 46 : central + 46 + len(name)] != name:
        central = data.index(b"PK\x01\x02", central + 4)
    struct.pack_into("<I", data, central + 24, declared)
    return bytes(data)


# --- the standalone ---------------------------------------------------------------------------


class Standalone:
    """``magnetar standalone --workers 3`` in a session of its own, and a REST client of it."""

    def __init__(self, work: Path, log: Path, settings: dict[str, str]) -> None:
        broker_port, http_port = find_free_port(), find_free_port()
        while http_port + WORKERS > 65535 or broker_port in range(http_port, http_port + WORKERS):
            http_port = find_free_port()
        self.broker_url = f"pulsar://127.0.0.1:{broker_port}"
        command = [
            sys.executable, "-m", "magnetar.cli", "standalone",
            "--workers", str(WORKERS), "--data-dir", str(work / "data"),
            "--broker-port", str(broker_port), "--http-port", str(http_port),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAGNETAR_")}
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**env, **settings},
                start_new_session=True,
            )
        self.cluster = Cluster(self.broker_url, work, "public/functions", {})
        self.workers = [
            WorkerProcess(f"worker-{i + 1}", http_port + i, self.process, log)
            for i in range(WORKERS)
        ]
        for worker in self.workers:
            self.cluster.workers[worker.worker_id] = worker

    def wait_ready(self) -> float:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"the standalone exited: see {self.workers[0].log}")
            try:
                return all(
                    self.cluster.http.get(w.url + READY_PATH, timeout=2).status_code == 200
                    for w in self.workers
                )
            except httpx.HTTPError:
                return False

        ready_s = wait_until(ready, 120, "the standalone ready", poll=0.2)
        self.cluster.wait_members(self.workers[0], WORKERS)
        return ready_s

    @property
    def via(self) -> WorkerProcess:
        return self.workers[0]

    def register(self, name: str, code: Path, **config: Any) -> None:
        self.cluster.register(self.via, name, code, **config)

    def post(self, name: str, config: dict[str, Any], code: tuple[str, bytes]) -> int:
        body = {"tenant": "public", "namespace": "default", "name": name, **config}
        response = self.cluster.http.post(
            f"{self.via.url}{FUNCTIONS}/{name}",
            data={"functionConfig": json.dumps(body)},
            files={"data": code},
            timeout=30,
        )
        return response.status_code

    def broker_restarts(self) -> int:
        """Restarts of the embedded broker by its healer so far (a client's connection
        ended without pulsar-lite removing its consumers: every client reconnects)."""
        log = self.workers[0].log.read_text(errors="replace")
        return log.count("magnetar.broker_healer: restarted the embedded broker")

    def instances(self, name: str) -> list[dict[str, Any]]:
        status = self.cluster.status(self.via, name)
        return [] if status is None else [i["status"] for i in status["instances"]]

    def delete(self, name: str) -> None:
        self.cluster.delete(self.via, name)
        self.cluster.wait_unassigned(self.via, name)

    def interrupt(self, timeout: float = 60.0) -> dict[str, Any]:
        """Ctrl-C: SIGINT to the process group; the seconds until the standalone exits and
        the processes of its group still there then (killed)."""
        started = time.perf_counter()
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout)
            stop_s: float | None = time.perf_counter() - started
        except subprocess.TimeoutExpired:
            stop_s = None
        left = [command_line(pid) for pid in magnetar_processes_in_group(self.process.pid)]
        try:  # the fork server notices its parent's exit by itself, a moment later
            all_gone_s: float | None = stop_s and stop_s + wait_until(
                lambda: not magnetar_processes_in_group(self.process.pid), 10, "all gone", 0.05
            )
        except RuntimeError:
            all_gone_s = None
        self.kill()
        return {
            "stop_s": stop_s,
            "processes_left_at_exit": left,
            "all_processes_gone_s": all_gone_s,
            "exit_code": self.process.poll(),
        }

    def kill(self) -> None:
        for pid in [self.process.pid, *magnetar_processes_in_group(self.process.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()
        self.cluster.http.close()


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return f"{pid} (gone)"


# --- the healthy load and the REST poller -------------------------------------------------------


class Load:
    """Inputs to the healthy function at ``rate`` a second, each with its send time; the
    outputs' arrival times and latencies."""

    def __init__(self, client: pulsar.Client, source: str, sink: str, rate: float) -> None:
        self.rate = rate
        self.sent = 0
        self.received: list[tuple[float, float]] = []
        """(arrival time, latency in ms) of every output, in arrival order (a duplicate
        output counts once: it is no throughput)."""
        self.duplicates = 0
        """Outputs of an input that had one already: a second output message."""
        self.redelivered = 0
        """Output messages this reader was handed again (as after a broker restart)."""
        self._seen: dict[bytes, str] = {}
        self._lock = threading.Lock()
        self._running = threading.Event()
        self._consumer = client.subscribe(sink, "abuse-bench", receiver_queue_size=10_000)
        self._producer = client.create_producer(
            source,
            batching_enabled=True,
            batching_max_publish_delay_ms=1,
            block_if_queue_full=True,
            max_pending_messages=50_000,
        )
        self._threads = [
            threading.Thread(target=self._send, daemon=True),
            threading.Thread(target=self._receive, daemon=True),
        ]

    def start(self) -> None:
        self._running.set()
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._running.clear()
        for thread in self._threads:
            thread.join(10)
        self._producer.close()
        self._consumer.close()

    def _send(self) -> None:
        started = time.perf_counter()
        while self._running.is_set():
            ahead = started + self.sent / self.rate - time.perf_counter()
            if ahead > 0.001:
                time.sleep(ahead)
            self._producer.send_async(f"t{time.time_ns()}".encode(), None)  # text, not a number
            self.sent += 1

    def _receive(self) -> None:
        while self._running.is_set():
            try:
                message = self._consumer.receive(200)
            except pulsar.Timeout:
                continue
            now = time.time()
            self._consumer.acknowledge(message)
            data = message.data()
            sent_ns = int(data.decode()[1:].rstrip("!"))
            with self._lock:
                message_id = str(message.message_id())
                if data in self._seen:
                    if self._seen[data] == message_id:
                        self.redelivered += 1
                    else:
                        self.duplicates += 1
                    continue
                self._seen[data] = message_id
                self.received.append((now, (now - sent_ns / 1e9) * 1000))

    def window(self, start: float, end: float) -> list[float]:
        """Latencies (ms) of the outputs that arrived between ``start`` and ``end``."""
        with self._lock:
            return [latency for at, latency in self.received if start <= at < end]

    def drained_at(self, count: int, timeout: float = 60.0) -> float | None:
        """When the ``count``-th output arrived (waiting for it up to ``timeout``), so the
        backlog of the first ``count`` inputs was gone; None if it did not come."""
        try:
            wait_until(lambda: len(self.received) >= count, timeout, "the backlog drained")
        except RuntimeError:
            return None
        with self._lock:
            return self.received[count - 1][0]


class RestPoller:
    """GET of the function list and of the healthy function's status, in turn on each
    worker, every ``REST_POLL_S``: (time, seconds, status code) of each."""

    def __init__(self, standalone: Standalone) -> None:
        self.standalone = standalone
        self.answers: list[tuple[float, float, int]] = []
        self._running = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._http = httpx.Client(timeout=30)

    def start(self) -> None:
        self._running.set()
        self._thread.start()

    def stop(self) -> None:
        self._running.clear()
        self._thread.join(35)
        self._http.close()

    def _poll(self) -> None:
        turn = 0
        while self._running.is_set():
            worker = self.standalone.workers[turn % WORKERS]
            path = FUNCTIONS if turn % 2 == 0 else f"{FUNCTIONS}/{HEALTHY}/status"
            started = time.perf_counter()
            try:
                code = self._http.get(worker.url + path).status_code
            except httpx.HTTPError:
                code = 0
            self.answers.append((time.time(), time.perf_counter() - started, code))
            turn += 1
            time.sleep(max(0.0, REST_POLL_S - (time.perf_counter() - started)))

    def window(self, start: float, end: float) -> tuple[list[float], int]:
        """Seconds of the answers between ``start`` and ``end``, and how many failed."""
        found = [(s, code) for at, s, code in self.answers if start <= at < end]
        return [s for s, _ in found], sum(1 for _, code in found if code != 200)


# --- the abuses -----------------------------------------------------------------------------


class Abuse:
    """One phase's abuse: ``begin`` sets it going (and returns once it is under way), ``tick``
    runs on a thread of its own until ``finished`` is set (the phase's end), ``end`` takes it
    away and says what it met."""

    def __init__(self, standalone: Standalone, client: pulsar.Client, files: dict[str, Path]):
        self.standalone = standalone
        self.client = client
        self.files = files
        self.outcome: dict[str, Any] = {}

    def begin(self) -> None:
        pass

    def tick(self, finished: threading.Event) -> None:
        pass

    def end(self) -> None:
        pass


class Quiet(Abuse):
    pass


class Admission(Abuse):
    REQUESTS: tuple[tuple[str, dict[str, Any]], ...] = (
        ("huge", {"parallelism": 10_000}),
        ("huger", {"parallelism": 10**23}),
        ("wide", {"parallelism": 50}),  # past max_instances_per_worker x 3
        ("n" * 1000, {}),
        ("a b", {}),
    )

    def tick(self, finished: threading.Event) -> None:
        codes: dict[str, int] = {}
        code = ("exclamation.py", EXAMPLE.read_bytes())
        config = {"className": "exclamation.ExclamationFunction", "inputs": ["abuse-refused"]}
        while not finished.is_set():
            for name, extra in self.REQUESTS:
                status = self.standalone.post(name, {**config, **extra}, code)
                codes[str(status)] = codes.get(str(status), 0) + 1
        self.outcome["answers"] = codes


class ZipBomb(Abuse):
    def begin(self) -> None:
        code = EXAMPLE.read_bytes()
        self.bomb = zip_of({"exclamation.py": code, "zeros.bin": bytes(128 * MIB)})
        liar = lying_zip({"exclamation.py": code, "zeros.bin": bytes(64 * MIB)}, "zeros.bin", 100)
        config = {
            "className": "exclamation.ExclamationFunction",
            "inputs": ["abuse-liar-in"],
            "parallelism": 1,
        }
        status = self.standalone.post("liar", config, ("liar.zip", liar))
        if status != 204:
            raise RuntimeError(f"the lying package was refused at registration: {status}")
        self.outcome.update(bomb_bytes=len(self.bomb), liar_bytes=len(liar))

    def tick(self, finished: threading.Event) -> None:
        codes: dict[str, int] = {}
        config = {"className": "exclamation.ExclamationFunction", "inputs": ["abuse-bomb-in"]}
        while not finished.is_set():
            status = self.standalone.post("bomb", config, ("bomb.zip", self.bomb))
            codes[str(status)] = codes.get(str(status), 0) + 1
        self.outcome["bomb_answers"] = codes

    def end(self) -> None:
        self.outcome["liar_status"] = summarize_instances(self.standalone.instances("liar"))
        self.standalone.delete("liar")


class ScriptChecks(Abuse):
    """Concurrent JavaScript creates whose top level runs half a second and throws: the
    worker loads each script to check it (V8 contexts on several threads at once crashed it),
    and refuses it."""

    SCRIPT = (
        b"var t = Date.now(); while (Date.now() - t < 500) {}\n"
        b"throw new Error('refused after half a second');\n"
    )

    def tick(self, finished: threading.Event) -> None:
        codes: dict[str, int] = {}
        lock = threading.Lock()

        def create(index: int) -> None:
            config = {"runtime": "JAVASCRIPT", "inputs": ["abuse-script-in"]}
            while not finished.is_set():
                status = self.standalone.post(f"script{index}", config, ("slow.js", self.SCRIPT))
                with lock:
                    codes[str(status)] = codes.get(str(status), 0) + 1

        threads = [threading.Thread(target=create, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.outcome["answers"] = codes


class OneFunction(Abuse):
    """An abusive function of its own, sent ``inputs()`` every ``every_s`` (0: once)."""

    name = ""
    module = ""
    """The code's file, when not ``name``'s."""
    class_name = ""
    parallelism = 1
    every_s = 1.0
    extra: ClassVar[dict[str, Any]] = {}

    def inputs(self) -> list[bytes]:
        return [b"go"]

    def begin(self) -> None:
        self.topic = f"abuse-{self.name}-in"
        self.standalone.register(
            self.name,
            self.files[self.module or self.name],
            className=self.class_name,
            inputs=[self.topic],
            output=f"abuse-{self.name}-out",
            parallelism=self.parallelism,
            **self.extra,
        )
        wait_until(
            lambda: (
                self.standalone.cluster.num_running(self.standalone.via, self.name)
                == self.parallelism
            ),
            60,
            f"{self.name} running",
            poll=0.2,
        )
        self.producer = self.client.create_producer(self.topic, batching_enabled=False)

    def tick(self, finished: threading.Event) -> None:
        sent = 0
        while not finished.is_set():
            for data in self.inputs():
                self.producer.send(data)
                sent += 1
            if not self.every_s:
                break
            finished.wait(self.every_s)
        self.outcome["inputs"] = sent

    def end(self) -> None:
        self.outcome["status"] = summarize_instances(self.standalone.instances(self.name))
        self.producer.close()
        self.standalone.delete(self.name)


class Poison(OneFunction):
    name, class_name = "poison", "poison.Poison"
    extra: ClassVar[dict[str, Any]] = {
        "maxMessageRetries": 1,
        "deadLetterTopic": "abuse-poison-dlq",
    }

    def begin(self) -> None:
        self.dead = self.client.subscribe(
            "abuse-poison-dlq",
            "abuse-bench",
            initial_position=pulsar.InitialPosition.Earliest,
        )
        super().begin()

    def tick(self, finished: threading.Event) -> None:
        self.producer.send(b"poison")  # one message that kills its process, then fine ones
        super().tick(finished)

    def inputs(self) -> list[bytes]:
        return [b"fine"]

    def end(self) -> None:
        dead = 0
        try:
            while True:
                self.dead.acknowledge(self.dead.receive(500))
                dead += 1
        except pulsar.Timeout:
            pass
        self.dead.close()
        self.outcome["dead_lettered"] = dead
        super().end()


class MemoryHog(OneFunction):
    name, class_name, every_s = "hog", "hog.Hog", 0.2
    extra: ClassVar[dict[str, Any]] = {"resources": {"cpu": 1, "ram": RAM_BYTES, "disk": 1 << 30}}


class LogFlood(OneFunction):
    name, class_name, every_s = "flood", "flood.Flood", 0.2


class Stuck(OneFunction):
    name, class_name, every_s = "stuck", "stuck.Stuck", 0


class CpuBurn(OneFunction):
    name, class_name, every_s, parallelism = "burn", "burn.Burn", 0, 3

    def inputs(self) -> list[bytes]:
        return [b"spin"] * 30  # Shared dispatch hands each instance some: each spins


class CpuBurnLimited(CpuBurn):
    """The same spinning instances, each held to a quarter of a core (``resources.cpu``)."""

    name, module = "burn-limited", "burn"
    extra: ClassVar[dict[str, Any]] = {"resources": {"cpu": 0.25}}


class ChildHog(OneFunction):
    name, module, class_name, every_s = "child-hog", "childhog", "childhog.ChildHog", 0.2
    extra: ClassVar[dict[str, Any]] = {"resources": {"ram": RAM_BYTES}}


class ShmFill(OneFunction):
    name, module, class_name, every_s = "shm-fill", "fill", "fill.Fill", 0.2
    extra: ClassVar[dict[str, Any]] = {"resources": {"ram": RAM_BYTES}}

    def inputs(self) -> list[bytes]:
        return [b"shm"]


class DiskFill(OneFunction):
    name, module, class_name, every_s = "disk-fill", "fill", "fill.Fill", 0.2
    extra: ClassVar[dict[str, Any]] = {"resources": {"ram": RAM_BYTES, "disk": 64 * MIB}}

    def inputs(self) -> list[bytes]:
        return [b"disk"]


ABUSES: dict[str, type[Abuse]] = {
    "quiet": Quiet,
    "admission": Admission,
    "zip-bomb": ZipBomb,
    "script-checks": ScriptChecks,
    "poison": Poison,
    "memory-hog": MemoryHog,
    "log-flood": LogFlood,
    "stuck": Stuck,
    "cpu-burn": CpuBurn,
    "cpu-burn-limited": CpuBurnLimited,
    "child-hog": ChildHog,
    "shm-fill": ShmFill,
    "disk-fill": DiskFill,
    "quiet-after": Quiet,
}


def summarize_instances(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ("running", "error", "numRestarts", "numReceived", "numUserExceptions")
    return [{k: status.get(k) for k in keys} for status in found]


# --- one run ----------------------------------------------------------------------------------


def phase(
    name: str,
    abuse: Abuse,
    load: Load,
    poller: RestPoller,
    seconds: float,
) -> dict[str, Any]:
    broker_restarts = abuse.standalone.broker_restarts()
    begun = time.perf_counter()
    abuse.begin()
    setup_s = time.perf_counter() - begun
    finished = threading.Event()
    ticker = threading.Thread(target=abuse.tick, args=(finished,), daemon=True)
    ticker.start()
    start, sent_before = time.time(), load.sent
    duplicates_before, redelivered_before = load.duplicates, load.redelivered
    time.sleep(seconds)
    end, sent = time.time(), load.sent
    finished.set()
    ticker.join(60)
    abuse.end()
    drained = load.drained_at(sent)
    broker_restarts = abuse.standalone.broker_restarts() - broker_restarts
    latencies = load.window(start, end)
    rest, failed = poller.window(start, end)
    return {
        "phase": name,
        "setup_s": setup_s,
        "seconds": end - start,
        "inputs_per_s": (sent - sent_before) / (end - start),
        "outputs_per_s": len(latencies) / (end - start),
        "latency_p50_ms": percentile(latencies, 0.5),
        "latency_p99_ms": percentile(latencies, 0.99),
        "drain_s": None if drained is None else max(0.0, drained - end),
        "duplicate_outputs": load.duplicates - duplicates_before,
        "outputs_redelivered_to_reader": load.redelivered - redelivered_before,
        "broker_restarts": broker_restarts,
        "rest_requests": len(rest),
        "rest_failed": failed,
        "rest_p50_ms": None if not rest else 1000 * statistics.median(rest),
        "rest_p99_ms": None if not rest else 1000 * (percentile(rest, 0.99) or 0),
        "load_average_1m": os.getloadavg()[0],
        "abuse": abuse.outcome,
    }


def worker_settings(args: argparse.Namespace) -> dict[str, str]:
    """SETTINGS, with CPU limits off when ``--no-cpu-limits`` asks (to measure them)."""
    off = {"MAGNETAR_INSTANCE_CPU_LIMITS": "false"} if args.no_cpu_limits else {}
    return {**SETTINGS, **off}


def one_run(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="magnetar-abuse-") as temp:
        work = Path(temp)
        files = packages(work)
        standalone = Standalone(work, logs / "standalone.log", worker_settings(args))
        client: pulsar.Client | None = None
        try:
            ready_s = standalone.wait_ready()
            progress(f"  standalone ready in {ready_s:.1f} s")
            client = create_client(standalone.broker_url, log_to_python=True)
            standalone.register(
                HEALTHY,
                EXAMPLE,
                className="exclamation.ExclamationFunction",
                inputs=["abuse-healthy-in"],
                output="abuse-healthy-out",
                parallelism=WORKERS,
            )
            wait_until(
                lambda: standalone.cluster.num_running(standalone.via, HEALTHY) == WORKERS,
                60,
                "the healthy function running",
                poll=0.2,
            )
            load = Load(client, "abuse-healthy-in", "abuse-healthy-out", args.rate)
            poller = RestPoller(standalone)
            load.start()
            poller.start()
            time.sleep(args.warm_up)
            if load.drained_at(load.sent) is None:
                raise RuntimeError("the healthy function does not keep up with the rate")
            phases = []
            for name in args.phases:
                result = phase(
                    name, ABUSES[name](standalone, client, files), load, poller, args.phase_s
                )
                phases.append(result)
                progress(
                    f"  {name:<12} {result['outputs_per_s']:>7.0f} msg/s, p99 "
                    f"{result['latency_p99_ms'] or 0:>7.1f} ms, drained in "
                    f"{result['drain_s'] or 0:.1f} s, REST p99 {result['rest_p99_ms'] or 0:.0f} ms"
                )
            poller.stop()
            load.stop()
            stuck = Stuck(standalone, client, files)
            stuck.begin()
            stuck.tick(threading.Event())
            wait_until(
                lambda: any(
                    "in user code" in (s.get("error") or "") for s in standalone.instances("stuck")
                ),
                30,
                "the stuck message reported",
                poll=0.5,
            )
            client.close()
            client = None
            stop = standalone.interrupt()
            progress(f"  Ctrl-C with an instance stuck in user code: {stop}")
        finally:
            if client is not None:
                client.close()
            if standalone.process.poll() is None:
                standalone.kill()
    return {"phases": phases, "stop": stop, "standalone_ready_s": ready_s}


def ratios(run: dict[str, Any]) -> None:
    """Each phase's ratios to the mean of the quiet phases, in place."""
    quiet = [p for p in run["phases"] if p["phase"] in ("quiet", "quiet-after")]

    def mean(key: str) -> float:
        return statistics.mean(p[key] for p in quiet if p[key] is not None)

    base_rate, base_rest = mean("outputs_per_s"), mean("rest_p99_ms")
    for p in run["phases"]:
        p["throughput_ratio"] = p["outputs_per_s"] / base_rate
        p["rest_p99_ratio"] = None if p["rest_p99_ms"] is None else p["rest_p99_ms"] / base_rest
        p["met"] = p["throughput_ratio"] >= THROUGHPUT_TARGET


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per phase, over the runs: the lowest throughput ratio and the median figures."""
    found: dict[str, dict[str, Any]] = {}
    for name in [p["phase"] for p in runs[0]["phases"]]:
        phases = [p for run in runs for p in run["phases"] if p["phase"] == name]

        def median(key: str, phases: list[dict[str, Any]] = phases) -> float | None:
            values = [p[key] for p in phases if p[key] is not None]
            return statistics.median(values) if values else None

        found[name] = {
            "lowest_throughput_ratio": min(p["throughput_ratio"] for p in phases),
            "median_latency_p99_ms": median("latency_p99_ms"),
            "median_rest_p99_ratio": median("rest_p99_ratio"),
            "duplicate_outputs": sum(p["duplicate_outputs"] for p in phases),
            "broker_restarts": sum(p["broker_restarts"] for p in phases),
        }
    return found


def print_table(results: dict[str, Any]) -> None:
    for index, run in enumerate(results["runs"]):
        rate = results["settings"]["rate"]
        print(
            f"\nrun {index + 1}: healthy exclamation x{WORKERS} at {rate:.0f}"
            f" msg/s on `magnetar standalone --workers {WORKERS}`, {results['cpus']} CPUs"
        )
        print(
            f"{'phase':<12} {'in/s':>6} {'out/s':>6} {'ratio':>6} {'p50 ms':>7} {'p99 ms':>8} "
            f"{'drain s':>7} {'dups':>5} {'heals':>5} {'REST p50':>8} {'REST p99':>8} {'ratio':>6} "
            f"{'load':>5}  met"
        )
        for p in run["phases"]:
            drain = "-" if p["drain_s"] is None else f"{p['drain_s']:.1f}"
            print(
                f"{p['phase']:<12} {p['inputs_per_s']:>6.0f} {p['outputs_per_s']:>6.0f} "
                f"{p['throughput_ratio']:>6.2f} "
                f"{p['latency_p50_ms'] or 0:>7.1f} {p['latency_p99_ms'] or 0:>8.1f} {drain:>7} "
                f"{p['duplicate_outputs']:>5} {p['broker_restarts']:>5} "
                f"{p['rest_p50_ms'] or 0:>8.1f} {p['rest_p99_ms'] or 0:>8.1f} "
                f"{p['rest_p99_ratio'] or 0:>6.2f} {p['load_average_1m']:>5.1f}  "
                f"{'yes' if p['met'] else 'NO'}"
            )
        stop = run["stop"]
        stop_s = "not within 60 s" if stop["stop_s"] is None else f"{stop['stop_s']:.1f} s"
        gone = stop["all_processes_gone_s"]
        print(
            f"Ctrl-C with an instance stuck in user code: stopped in {stop_s} (target <= "
            f"{STOP_TARGET_S:.0f}); {len(stop['processes_left_at_exit'])} of its processes left "
            f"at its exit, all gone {'never' if gone is None else f'at {gone:.1f} s'}"
        )
    if len(results["runs"]) > 1:
        print(f"\nover {len(results['runs'])} runs:")
        print(f"{'phase':<12} {'lowest ratio':>12} {'p99 ms (median)':>15} {'REST p99 ratio':>14}")
        for name, row in results["summary"].items():
            print(
                f"{name:<12} {row['lowest_throughput_ratio']:>12.2f} "
                f"{row['median_latency_p99_ms'] or 0:>15.1f} "
                f"{row['median_rest_p99_ratio'] or 0:>14.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2000, help="healthy inputs per second")
    parser.add_argument("--phase-s", type=float, default=15)
    parser.add_argument("--warm-up", type=float, default=5)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--phases",
        type=lambda text: text.split(","),
        default=list(ABUSES),
        help=f"of {','.join(ABUSES)}",
    )
    parser.add_argument(
        "--no-cpu-limits",
        action="store_true",
        help="run the workers with instance_cpu_limits off (resources.cpu not enforced)",
    )
    parser.add_argument("--json", action="store_true", help="print the JSON instead of a table")
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "abuse.json"))
    args = parser.parse_args()
    unknown = [name for name in args.phases if name not in ABUSES]
    if unknown:
        parser.error(f"unknown phases {unknown}: choose from {','.join(ABUSES)}")

    runs = []
    for index in range(args.runs):
        progress(f"run {index + 1} of {args.runs}:")
        run = one_run(args, Path(args.output).parent / "abuse-logs" / f"run-{index + 1}")
        ratios(run)
        runs.append(run)
    results = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "settings": {**vars(args), "workers": WORKERS, "worker_settings": worker_settings(args)},
        "broker": "embedded pulsar-lite (magnetar standalone)",
        "targets": {
            "throughput_ratio": f">= {THROUGHPUT_TARGET}",
            "ctrl_c_stop_s": f"<= {STOP_TARGET_S}",
        },
        "summary": summarize(runs),
        "runs": runs,
    }
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2))
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_table(results)
        print(f"\nwritten to {output}")


if __name__ == "__main__":
    main()
