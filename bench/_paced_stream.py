"""The two ends of a measured stream, each a process of its own so that neither starves the
other of the GIL (in one process, at 10,000 msg/s, the harness was slower than what it
measured):

* ``send``: sends ``TOTAL`` unbatched inputs ``<index>:<wall-clock ns of the send>`` at
  ``RATE`` a second, in bursts of what is due at each wake (about every half millisecond),
  and prints how well it kept the pace;
* ``receive``: subscribes to the output topic, sends probes into the input topic until one
  comes out (the subject runs), prints ``flowing``, then times every output from its send
  until it has them all or they stop coming, and prints p50/p99/p999 of the inputs after the
  warm-up, with the outputs missing and how long the subject lagged after the last send.
  An output seen again is a duplicate; ``resent`` counts those stored again under another
  message id (the subject sent it twice), where the rest are the broker handing the same
  stored output out again. The receiver's subscription is Shared: pulsar-lite hands an
  Exclusive one stored messages again, several times over under many small batches.

    python bench/_paced_stream.py send URL SOURCE RATE TOTAL
    python bench/_paced_stream.py receive URL SOURCE SINK TOTAL COUNTED_FROM MIN_SECONDS
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import pulsar
from _cluster import percentile

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
PROBE_TIMEOUT_S = 90.0
IDLE_S = 5.0
"""A subject that has sent nothing for this long, after the stream should have ended, is
done: what it has not sent is missing."""
HARD_LIMIT_S = 60.0
"""The longest a lagging subject is waited for beyond the stream's end."""


def send(service_url: str, source: str, rate: int, total: int) -> dict[str, Any]:
    client = pulsar.Client(service_url, logger=QUIET)
    producer = client.create_producer(
        source, batching_enabled=False, block_if_queue_full=True, max_pending_messages=50_000
    )
    interval_ns = 1_000_000_000 / rate
    slips: list[float] = []
    started = time.time_ns()
    index = 0
    while index < total:
        due = min(total, int((time.time_ns() - started) / interval_ns) + 1)
        while index < due:
            now = time.time_ns()
            producer.send_async(f"{index}:{now}".encode(), None)
            slips.append(now - started - index * interval_ns)
            index += 1
        sleep_s = (started + index * interval_ns - time.time_ns()) / 1e9
        if sleep_s > 0:
            time.sleep(max(sleep_s, 0.0005))
    producer.flush()
    elapsed_s = (time.time_ns() - started) / 1e9
    client.close()
    slips.sort()
    return {
        "sent": total,
        "rate_kept": round(total / elapsed_s, 1),
        "slip_p99_ms": round(slips[int(0.99 * (len(slips) - 1))] / 1e6, 3),
        "slip_max_ms": round(slips[-1] / 1e6, 3),
    }


def wait_flowing(client: pulsar.Client, source: str, consumer: Any) -> None:
    """Send probes until one comes out: the subject is subscribed and running."""
    producer = client.create_producer(source, batching_enabled=False)
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            producer.send(b"probe")
            try:
                while True:
                    if consumer.receive(500).data() == b"probe!":
                        return
            except pulsar.Timeout:
                continue
        raise SystemExit(f"no output for the probes sent to {source} within {PROBE_TIMEOUT_S} s")
    finally:
        producer.close()


def receive(
    service_url: str, source: str, sink: str, total: int, counted_from: int, min_seconds: float
) -> dict[str, Any]:
    client = pulsar.Client(service_url, logger=QUIET)
    # Shared, though alone: pulsar-lite hands an Exclusive subscription stored messages again
    # when publishes race its dispatch, several times over under many small batches (three
    # instances' outputs at 10,000 msg/s came 3-5 times each), and the broker's time spent so
    # was the subjects' loss
    consumer = client.subscribe(
        sink, "latency", receiver_queue_size=10_000, consumer_type=pulsar.ConsumerType.Shared
    )
    wait_flowing(client, source, consumer)
    print("flowing", flush=True)
    ends_at = time.monotonic() + min_seconds
    latencies: list[float] = []
    first_ids: list[Any] = [None] * total
    received = duplicates = resent = 0
    last_sent_ns = last_output_ns = 0
    last_output_at = time.monotonic()
    while received < total:
        try:
            message = consumer.receive(200)
        except pulsar.Timeout:
            now_s = time.monotonic()
            if now_s > ends_at + HARD_LIMIT_S or (
                now_s > ends_at and now_s - last_output_at > IDLE_S
            ):
                break
            continue
        now = time.time_ns()
        # acknowledged: pulsar-lite hands unacknowledged messages out again (duplicates)
        consumer.acknowledge(message)
        data = message.data()
        if data == b"probe!":
            continue
        index_text, sent_text = data.rstrip(b"!").split(b":")
        index, sent = int(index_text), int(sent_text)
        message_id = message.message_id()
        if first_ids[index] is not None:
            duplicates += 1
            resent += first_ids[index] != message_id
            continue
        first_ids[index] = message_id
        received += 1
        last_output_at = time.monotonic()
        last_output_ns = max(last_output_ns, now)
        last_sent_ns = max(last_sent_ns, sent)
        if index >= counted_from:
            latencies.append((now - sent) / 1e6)
    client.close()
    return {
        **percentiles(latencies),
        "missing": total - received,
        "duplicates": duplicates,
        "resent": resent,
        # the time from the last send whose output came until the last output: a subject
        # that keeps up has it near its latency, one that lags has its backlog here
        "drain_ms": round((last_output_ns - last_sent_ns) / 1e6, 3) if received else None,
    }


def percentiles(latencies: list[float]) -> dict[str, Any]:
    def at(q: float) -> float | None:
        value = percentile(latencies, q)
        return None if value is None else round(value, 3)

    return {"p50": at(0.5), "p99": at(0.99), "p999": at(0.999), "count": len(latencies)}


def main(argv: list[str]) -> None:
    if argv[:1] == ["send"] and len(argv) == 5:
        result = send(argv[1], argv[2], int(argv[3]), int(argv[4]))
    elif argv[:1] == ["receive"] and len(argv) == 7:
        result = receive(argv[1], argv[2], argv[3], int(argv[4]), int(argv[5]), float(argv[6]))
    else:
        raise SystemExit(__doc__)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
