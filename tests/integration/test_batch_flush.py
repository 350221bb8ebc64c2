"""Sending open batches early must never deadlock the client (the regression: the client's
``flush_async`` held the GIL while it waited for the producer's lock, and the client's I/O
thread held that lock while it waited for the GIL; every consumer and producer of the client
then stopped, the test suite's reader with them)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_SENDER = textwrap.dedent(
    """
    import sys, time
    import pulsar
    from magnetar.instance.delivery import Chunk, ChunkSender

    client = pulsar.Client(sys.argv[1], logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    # a short publish delay: the client's batch timer fires while the sender flushes
    producer = client.create_producer(
        sys.argv[2], batching_enabled=True, batching_max_publish_delay_ms=1
    )
    sender = ChunkSender(large_message_bytes=1 << 20)
    chunks = 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        chunk = Chunk()
        for _ in range(3):
            sender.send(chunk, producer, b"x", {})
        sender.seal(chunk)
        sender.flush()
        chunks += 1
    producer.flush()
    sender.close()
    while len(sender.collect()) < chunks:
        sender.wait_completed(1)
    print(chunks, len(sender.collect()))
    client.close()
    """
)


def test_early_flushes_beside_batch_timers_never_deadlock(broker_url: str, topic: str) -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", _SENDER, broker_url, topic],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("3 s of sends and early flushes still running after 60 s: deadlocked")
    assert done.returncode == 0, done.stderr[-2000:]
    sent, completed = map(int, done.stdout.split())
    assert sent > 100 and completed == sent
