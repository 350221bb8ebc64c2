"""Magnetar's clients on each broker: the broker says what it is, and only pulsar-lite gets
the consumer-id spread (Apache Pulsar tells consumers apart per connection) and the small
prefetch of instances sharing a subscription."""

from __future__ import annotations

import pytest

from magnetar.broker_probe import server_version
from magnetar.client import create_client, shared_acks_cost_gaps
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
