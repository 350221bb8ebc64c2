"""State through `magnetar functions localrun`: a word count over a known text, with its
instance killed (kill -9) mid-stream, counts every word exactly once (EFFECTIVELY_ONCE)."""

from __future__ import annotations

import collections
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pulsar

from magnetar.statestore import StateQueryService
from tests.conftest import EXAMPLES, MAGNETAR, instance_pids

TEXT = [
    "to be or not to be that is the question",
    "whether tis nobler in the mind to suffer",
    "the slings and arrows of outrageous fortune",
    "or to take arms against a sea of troubles",
]


def localrun(name: str, topic: str, state_dir: Path, broker_url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *MAGNETAR,
            "--broker-url",
            broker_url,
            "functions",
            "localrun",
            "--py",
            str(EXAMPLES / "word_count.py"),
            "--classname",
            "word_count.WordCountFunction",
            "--name",
            name,
            "--inputs",
            topic,
            "--subs-position",
            "Earliest",
            "--processing-guarantees",
            "EFFECTIVELY_ONCE",
            "--state-dir",
            str(state_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_word_count_through_localrun_is_exact_after_kill_9_of_its_instance(
    client: pulsar.Client, broker_url: str, tmp_path: Path
) -> None:
    name = f"wc-{uuid.uuid4().hex[:8]}"
    topic = f"words-{name}"
    fqfn = f"public/default/{name}"
    lines = [TEXT[i % len(TEXT)] for i in range(3000)]
    expected = collections.Counter(word for line in lines for word in line.split())
    queries = StateQueryService(client, tmp_path / "queries")

    def counted() -> dict[str, int]:
        found = {word: queries.get(fqfn, word) for word in expected}
        return {word: entry.counter for word, entry in found.items() if entry and entry.counter}

    producer = client.create_producer(topic, batching_enabled=False)
    # the second half is sent only after the kill, so the kill surely lands mid-stream (a
    # state query waits for the journal's catch-up: polling it could outlast the stream)
    half = len(lines) // 2

    def produce(part: list[str]) -> None:
        for line in part:
            producer.send_async(line.encode(), None)
            time.sleep(0.001)
        producer.flush()

    first = localrun(name, topic, tmp_path / "state", broker_url)
    try:
        # the stream starts once the instance consumes, so the kill lands in its middle
        producer.send(lines[0].encode())
        deadline = time.monotonic() + 60
        while not counted() and time.monotonic() < deadline:
            time.sleep(0.1)
        stream = threading.Thread(target=produce, args=(lines[1:half],))
        stream.start()
        while sum(counted().values()) < 2000 and time.monotonic() < deadline:
            time.sleep(0.2)
        [pid] = instance_pids(first.pid)
        subprocess.run(["kill", "-9", str(pid)], check=True)  # mid-stream, nothing drained
        output, _ = first.communicate(timeout=60)
        assert first.returncode == 1
        assert "instance 0 failed" in output
        partial = sum(counted().values())
        assert 0 < partial < sum(expected.values())
        stream.join(60)
    finally:
        if first.poll() is None:
            first.kill()
    second = localrun(name, topic, tmp_path / "state", broker_url)
    try:
        produce(lines[half:])
        producer.close()
        deadline = time.monotonic() + 60
        while counted() != expected and time.monotonic() < deadline:
            time.sleep(0.5)
        assert counted() == expected
    finally:
        second.send_signal(signal.SIGINT)
        output, _ = second.communicate(timeout=60)
        queries.stop()
    assert second.returncode == 0, output
    assert counted_after_stop(client, tmp_path, fqfn, expected) == expected


def counted_after_stop(
    client: pulsar.Client, tmp_path: Path, fqfn: str, expected: collections.Counter[str]
) -> dict[str, int]:
    """The counts once everything in flight has settled, from a fresh table."""
    queries = StateQueryService(client, tmp_path / "after")
    try:
        found = {word: queries.get(fqfn, word) for word in expected}
        return {word: entry.counter for word, entry in found.items() if entry and entry.counter}
    finally:
        queries.stop()
