"""Magnetar's clients on each broker: the broker says what it is, and only pulsar-lite gets
the consumer-id spread (Apache Pulsar tells consumers apart per connection), its short
operation timeout and the small prefetch of instances sharing a subscription."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from typing import Any

import pulsar
import pytest

from magnetar.broker_probe import server_version
from magnetar.client import create_client, shared_acks_cost_gaps
from magnetar.instance import FunctionConfig, InstanceOptions
from magnetar.instance.broker_options import for_broker
from tests.conftest import ApachePulsar, Broker

pytestmark = pytest.mark.brokers("lite", "apache")

SPREAD_TOPIC = "__magnetar_consumer_ids"


def test_the_broker_says_what_it_is(broker: Broker, broker_kind: str) -> None:
    version = server_version(broker.service_url)
    expected = "Pulsar-Lite-" if broker_kind == "lite" else "Pulsar Server4."
    assert version is not None and version.startswith(expected), version


def test_only_pulsar_lite_costs_more_per_gap_in_a_shared_subscription(
    broker: Broker, broker_kind: str
) -> None:
    assert shared_acks_cost_gaps(broker.service_url) is (broker_kind == "lite")
    assert shared_acks_cost_gaps("pulsar://127.0.0.1:1") is False


def test_instances_are_set_up_for_their_broker(broker: Broker, broker_kind: str) -> None:
    """Only pulsar-lite's shared subscriptions prefetch little and acknowledge at once; only
    Apache Pulsar deduplicates EFFECTIVELY_ONCE outputs and has an ordered subscription's
    instance ask for what a take-over left unsent."""
    lite = broker_kind == "lite"

    def options(**config: Any) -> InstanceOptions:
        function = FunctionConfig(name="f", py="f.py", inputs=["in"], **config)
        return for_broker(InstanceOptions(), function, broker.service_url)

    assert options(parallelism=3).shared_acks_cost_gaps is lite
    assert options(parallelism=1).shared_acks_cost_gaps is False
    assert options(processing_guarantees="EFFECTIVELY_ONCE").broker_may_deduplicate is not lite
    assert options(retain_ordering=True).stranded_check_s == (None if lite else 5.0)


def test_no_server_version_where_no_broker_answers() -> None:
    assert server_version("pulsar://127.0.0.1:1") is None
    assert server_version("pulsar+ssl://127.0.0.1:6651") is None


@pytest.mark.brokers("apache")
def test_clients_of_apache_pulsar_spread_no_consumer_ids(apache_pulsar: ApachePulsar) -> None:
    for _ in range(3):  # each client would spread up to 128 ids with a 1 in 128 chance of none
        create_client(apache_pulsar.service_url).close()
    for domain in ("persistent", "non-persistent"):
        topics = apache_pulsar.admin("GET", f"/admin/v2/{domain}/public/default").json()
        assert not [t for t in topics if SPREAD_TOPIC in t], topics


PAUSE_S = 5.0
"""Longer than pulsar-lite's operation timeout (3 s), as a long garbage collection may be."""


@pytest.mark.brokers("apache")
def test_a_client_of_apache_pulsar_waits_out_a_broker_pause(apache_pulsar: ApachePulsar) -> None:
    """A producer asked for while the broker is paused is made once it resumes, as Apache
    Pulsar's own instances (30 s) wait; with pulsar-lite's 3 s it failed with a timeout."""
    pid = getattr(apache_pulsar, "pid", None)
    if pid is None:
        pytest.skip("pauses the broker: needs the Apache Pulsar standalone this run started")
    client = create_client(apache_pulsar.service_url)
    topic = f"paused-{uuid.uuid4().hex[:8]}"
    try:
        client.create_producer(f"{topic}-first").close()  # connected before the pause
        resume = threading.Timer(PAUSE_S, os.kill, (pid, signal.SIGCONT))
        os.kill(pid, signal.SIGSTOP)
        resume.start()
        try:
            started = time.monotonic()
            producer = client.create_producer(topic)
            waited = time.monotonic() - started
        finally:
            resume.join()
            os.kill(pid, signal.SIGCONT)
        producer.send(b"after the pause")
        consumer = client.subscribe(
            topic, "check", initial_position=pulsar.InitialPosition.Earliest
        )
        assert consumer.receive(10_000).data() == b"after the pause"
    finally:
        client.close()
    assert waited >= PAUSE_S - 0.5, f"the producer was made in {waited:.1f} s: no pause seen"
