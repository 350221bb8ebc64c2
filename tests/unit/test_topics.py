"""Topic names: the short forms users type and the full names the broker reports."""

from __future__ import annotations

import pytest

from magnetar.topics import base_topic, full_topic_name


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        ("orders", "persistent://public/default/orders"),
        ("acme/sales/orders", "persistent://acme/sales/orders"),
        ("persistent://acme/sales/orders", "persistent://acme/sales/orders"),
        ("non-persistent://acme/sales/orders", "non-persistent://acme/sales/orders"),
        ("orders-partition-0", "persistent://public/default/orders-partition-0"),
    ],
)
def test_full_topic_name(topic: str, expected: str) -> None:
    assert full_topic_name(topic) == expected


def test_full_topic_name_is_idempotent() -> None:
    once = full_topic_name("acme/sales/orders")
    assert full_topic_name(once) == once


@pytest.mark.parametrize("topic", ["", "a/b", "a/b/c/d", "a//b", "/a/b", "a/b/"])
def test_invalid_short_names(topic: str) -> None:
    with pytest.raises(ValueError) as caught:
        full_topic_name(topic)
    message = str(caught.value)
    assert message.startswith(f"invalid topic name {topic!r}")
    assert "'tenant/namespace/name'" in message


@pytest.mark.parametrize(
    "topic",
    [
        "http://acme/sales/orders",
        "persistent://acme/orders",
        "persistent://acme/sales/orders/extra",
        "://acme/sales/orders",
        "persistent://acme//orders",
        "persistent://acme/sales/",
    ],
)
def test_invalid_full_names(topic: str) -> None:
    with pytest.raises(ValueError, match="invalid topic name"):
        full_topic_name(topic)


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        ("orders", "persistent://public/default/orders"),
        ("orders-partition-3", "persistent://public/default/orders"),
        ("persistent://acme/sales/orders-partition-12", "persistent://acme/sales/orders"),
        ("acme/sales/orders-partition-0", "persistent://acme/sales/orders"),
        ("orders-partition-", "persistent://public/default/orders-partition-"),
        ("orders-partition-x", "persistent://public/default/orders-partition-x"),
        ("a-partition-1-partition-2", "persistent://public/default/a-partition-1"),
    ],
)
def test_base_topic(topic: str, expected: str) -> None:
    assert base_topic(topic) == expected


def test_base_topic_of_an_invalid_name() -> None:
    with pytest.raises(ValueError, match="invalid topic name 'a/b-partition-1'"):
        base_topic("a/b-partition-1")
