"""Structured Streaming: micro-batches with a limit, and exact restarts from a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pulsar
import pytest
from pyspark.sql import SparkSession

from tests.spark.conftest import Batches, produce, run_available_now

pytestmark = pytest.mark.spark


def test_available_now_with_max_records_per_trigger(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, tmp_path: Path
) -> None:
    sent = [f"m{i}" for i in range(55)]
    produce(client, topic, sent, batched=True)
    batches: Batches = {}

    run_available_now(
        spark,
        broker_url,
        tmp_path / "checkpoint",
        {"topic": topic, "startingOffsets": "earliest", "maxRecordsPerTrigger": "20"},
        batches,
    )

    assert [len(batches[i]) for i in sorted(batches)] == [20, 20, 15]
    assert [value for i in sorted(batches) for value in batches[i]] == sent


def test_limit_is_shared_by_several_topics(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, tmp_path: Path
) -> None:
    a = [f"a{i}" for i in range(30)]
    b = [f"b{i}" for i in range(6)]
    produce(client, f"{topic}-a", a, batched=True)
    produce(client, f"{topic}-b", b)
    batches: Batches = {}

    run_available_now(
        spark,
        broker_url,
        tmp_path / "checkpoint",
        {
            "topics": f"{topic}-a,{topic}-b",
            "startingOffsets": "earliest",
            "maxRecordsPerTrigger": "16",
        },
        batches,
    )

    # 8 + 6 (b has no more; its unused share goes to a: 8 + 2) then 16, then what is left.
    assert [len(batches[i]) for i in sorted(batches)] == [16, 16, 4]
    everything = [value for i in sorted(batches) for value in batches[i]]
    assert sorted(everything) == sorted(a + b)


def test_restart_after_failure_reads_exactly_the_rest(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    options = {"topic": topic, "startingOffsets": "earliest", "maxRecordsPerTrigger": "20"}
    first = [f"first{i}" for i in range(50)]
    produce(client, topic, first, batched=True)
    batches: Batches = {}

    with pytest.raises(Exception, match="injected failure in batch 1"):
        run_available_now(spark, broker_url, checkpoint, options, batches, lambda i: i == 1)
    assert sorted(batches) == [0, 1]

    # Produced while the query is down, across batched and unbatched entries.
    second = [f"second{i}" for i in range(25)]
    produce(client, topic, second[:15])
    produce(client, topic, second[15:], batched=True)
    run_available_now(spark, broker_url, checkpoint, options, batches)

    everything = [value for i in sorted(batches) for value in batches[i]]
    assert everything == first + second  # the failed batch ran again with the same range
    assert len(set(everything)) == len(everything)
    assert all(len(batches[i]) <= 20 for i in batches)


def test_latest_start_reads_only_what_comes_after(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoint"
    produce(client, topic, [f"old{i}" for i in range(10)], batched=True)
    batches: Batches = {}
    run_available_now(spark, broker_url, checkpoint, {"topic": topic}, batches)
    assert all(not values for values in batches.values())

    produce(client, topic, ["new0", "new1", "new2"])
    run_available_now(spark, broker_url, checkpoint, {"topic": topic}, batches)

    assert [value for i in sorted(batches) for value in batches[i]] == ["new0", "new1", "new2"]
