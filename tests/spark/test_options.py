"""Bad options fail before anything is read, with a message naming the option."""

from __future__ import annotations

import tempfile

import pytest
from pyspark.sql import SparkSession

from magnetar.spark_connector import InvalidOptionError
from magnetar.spark_connector._options import parse_sink_options, parse_source_options
from tests.spark.conftest import read

pytestmark = pytest.mark.spark

URL = "pulsar://127.0.0.1:6650"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "t", "startingOffsets": "latest"}, "starting offset can't be latest"),
        ({"topic": "t", "endingOffsets": "earliest"}, "ending offset can't be earliest"),
        ({}, "one of the topic options: topic, topics, topicsPattern \\(got none\\)"),
        ({"topic": "t", "topics": "u"}, "one of the topic options: .* \\(got topic, topics\\)"),
        (
            {"topic": "t", "startingOffsets": "{oops"},
            "startingOffsets is neither .* nor valid JSON",
        ),
        ({"topic": "t", "startingOffsets": "[1, 2]"}, "startingOffsets must be 'earliest'"),
        (
            {"topic": "t", "endingOffsets": '{"other": [8, 1, 16, 2]}'},
            "endingOffsets names persistent://public/default/other, which is not read",
        ),
        (
            {"topic": "t", "startingOffsets": '{"t": [300]}'},
            "bytes of MessageId.serialize",
        ),
        ({"topic": "t", "startingTime": "yesterday"}, "startingTime must be a publish time"),
        ({"topic": "t", "failOnDataLoss": "maybe"}, "failOnDataLoss must be true or false"),
        ({"topic": "t", "pollTimeoutMs": "0"}, "pollTimeoutMs must be a positive integer"),
        ({"topicsPattern": "t.*"}, "topicsPattern needs admin.url"),
        ({"topic": "t", "startOffsets": "earliest"}, "unknown option 'startoffsets'"),
        (
            {"topic": "t", "pulsar.client.authToken": "x"},
            "pulsar.client.authtoken: authtoken not supported by pulsar",
        ),
    ],
)
def test_batch_read_rejects(
    spark: SparkSession, broker_url: str, options: dict[str, str], message: str
) -> None:
    """As a user meets them: through spark.read (Spark wraps the error, keeping the text)."""
    with pytest.raises(Exception, match=message):
        read(spark, broker_url, **options).count()


def test_missing_service_url_is_named() -> None:
    with pytest.raises(InvalidOptionError, match=r"option service\.url is required"):
        parse_source_options({"topic": "t"}, "batch")
    with pytest.raises(InvalidOptionError, match="not a Pulsar service URL"):
        parse_source_options({"topic": "t", "service.url": "http://x:8080"}, "batch")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"endingOffsets": "latest"}, "endingOffsets is not allowed in a streaming query"),
        ({"endingTime": "1700000000000"}, "endingTime is not allowed in a streaming query"),
        ({"maxRecordsPerTrigger": "-5"}, "maxRecordsPerTrigger must be a positive integer"),
    ],
)
def test_streaming_read_rejects(
    spark: SparkSession, broker_url: str, options: dict[str, str], message: str
) -> None:
    stream = (
        spark.readStream.format("pulsar")
        .option("service.url", broker_url)
        .option("topic", "t")
        .options(**options)
        .load()
    )
    with tempfile.TemporaryDirectory() as checkpoint, pytest.raises(Exception, match=message):
        query = (
            stream.writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(60)
        finally:
            query.stop()


def test_case_of_option_names_does_not_matter() -> None:
    options = parse_source_options(
        {"SERVICE.URL": URL, "Topics": "a, b", "FAILONDATALOSS": "False"}, "batch"
    )
    assert options.topics == ("persistent://public/default/a", "persistent://public/default/b")
    assert options.fail_on_data_loss is False


def test_sink_rejects_read_options() -> None:
    with pytest.raises(InvalidOptionError, match="unknown option 'startingoffsets'"):
        parse_sink_options({"service.url": URL, "topic": "t", "startingOffsets": "earliest"})
