"""`magnetar spark read|replay`, invoked through `magnetar` with the global options a user
passes."""

from __future__ import annotations

import json
from pathlib import Path

import pulsar
import pytest
from click.testing import CliRunner, Result
from pyspark.sql import SparkSession

from magnetar.cli import main
from tests.cluster.conftest import Cluster
from tests.conftest import EXAMPLES
from tests.spark.conftest import full, id_json, produce, read, texts

pytestmark = pytest.mark.spark


def run(broker_url: str | None, *args: str, output: str = "json") -> Result:
    options = ["--output", output] + (["--broker-url", broker_url] if broker_url else [])
    return CliRunner().invoke(main, [*options, "spark", *args])


def test_read_writes_files_and_reports_counts(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, tmp_path: Path
) -> None:
    ids = produce(client, topic, [f"m{i}" for i in range(20)], batched=True)
    produce(client, f"{topic}-2", ["other"])
    out = tmp_path / "out"

    result = run(
        broker_url,
        *("read", "--topic", topic, "--topic", f"{topic}-2", "--format", "json"),
        *("--ending-offsets", id_json(topic, ids[9]), "--path", str(out)),
    )

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "path": str(out),
        "format": "json",
        "messages": 11,
        "topics": {full(topic): 10, full(f"{topic}-2"): 1},
    }
    values = sorted(row["value"] for row in spark.read.json(str(out)).collect())
    assert values == sorted(["other"] + [f"m{i}" for i in range(10)])


def test_read_as_a_table_for_people(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, tmp_path: Path
) -> None:
    produce(client, topic, ["a", "b"])

    result = run(
        broker_url, "read", "--topic", topic, "--path", str(tmp_path / "p"), output="table"
    )

    assert result.exit_code == 0, result.output
    width = len(full(topic))
    assert result.stdout.splitlines() == [
        f"{'topic':<{width}}  messages",
        f"{full(topic)}  {2:>8}",
        f"2 messages written to {tmp_path / 'p'} (parquet)",
    ]
    assert sorted(texts(spark.read.parquet(str(tmp_path / "p")))) == ["a", "b"]


def test_replay_from_code_to_a_topic(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str
) -> None:
    ids = produce(client, topic, [f"in{i}" for i in range(12)])

    result = run(
        broker_url,
        *("replay", "--py", str(EXAMPLES / "exclamation.py")),
        *("--classname", "exclamation.ExclamationFunction", "--topic", topic),
        *("--starting-offsets", id_json(topic, ids[2]), "--to-topic", f"{topic}-out"),
    )

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["inputs"] == 10
    assert report["outputs"] == 10
    assert report["userExceptions"] == 0
    assert texts(read(spark, broker_url, topic=f"{topic}-out")) == [f"in{i}!" for i in range(2, 12)]


def test_replay_by_fqfn_runs_the_registered_code_and_config(
    spark: SparkSession, client: pulsar.Client, broker_url: str, topic: str, tmp_path: Path
) -> None:
    """The worker hands out the function's config and code (Pulsar's .../download); the
    replay reads the function's own inputs and applies its user config."""
    cluster = Cluster(broker_url, tmp_path)
    try:
        worker = cluster.start_worker("w1")
        produce(client, topic, ["x", "y", "z"])
        created = cluster.create(
            worker,
            f"pub-{topic}",
            example="publish.py",
            className="publish.PublishFunction",
            inputs=[topic],
            userConfig={"publish-topic": f"{topic}-published"},
        )
        assert created.status_code == 204, created.text

        result = CliRunner().invoke(
            main,
            [
                *("--output", "json", "--broker-url", broker_url, "--admin-url", worker.url),
                *("spark", "replay", "--fqfn", f"public/default/pub-{topic}"),
                *("--path", str(tmp_path / "out")),
            ],
        )
    finally:
        cluster.stop_all()

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["inputs"], report["published"], report["userExceptions"]) == (3, 3, 0)
    written = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(bytes(r.value).decode() for r in written) == ["x!", "y!", "z!"]
    assert {r["__topic"] for r in written} == {full(f"{topic}-published")}


def test_replay_by_fqfn_of_a_function_that_is_not_there(broker_url: str, tmp_path: Path) -> None:
    cluster = Cluster(broker_url, tmp_path)
    try:
        worker = cluster.start_worker("w1")
        result = CliRunner().invoke(
            main,
            [
                *("--broker-url", broker_url, "--admin-url", worker.url),
                *("spark", "replay", "--fqfn", "public/default/nope", "--path", "x"),
            ],
        )
    finally:
        cluster.stop_all()

    assert result.exit_code == 1
    assert "Function nope doesn't exist" in result.stderr


def test_bad_offsets_give_one_clear_line(broker_url: str, topic: str, tmp_path: Path) -> None:
    result = run(
        broker_url,
        *("read", "--topic", topic, "--starting-offsets", "{oops"),
        *("--path", str(tmp_path / "never")),
    )

    assert result.exit_code == 1
    assert result.stderr.startswith(
        "Error: startingOffsets is neither 'earliest', 'latest' nor valid JSON"
    )
    assert len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "never").exists()


def test_a_function_that_does_not_load_is_reported_before_the_job(
    broker_url: str, client: pulsar.Client, topic: str, tmp_path: Path
) -> None:
    produce(client, topic, ["a"])
    result = run(
        broker_url,
        *("replay", "--py", str(EXAMPLES / "exclamation.py"), "--classname", "exclamation.Nope"),
        *("--topic", topic, "--path", str(tmp_path / "out")),
    )

    assert result.exit_code == 1
    assert result.stderr == (
        "Error: module 'exclamation' has no class or function 'Nope'; it defines: "
        "ExclamationFunction\n"
    )


def test_errors_inside_a_spark_job_are_one_line_too(
    broker_url: str, client: pulsar.Client, topic: str, tmp_path: Path
) -> None:
    """A payload that does not decode with the values' schema fails the executor's task."""
    ids = produce(client, topic, ['{"name": "a"}', "not json"])
    definition = json.dumps(
        {"type": "record", "name": "R", "fields": [{"name": "name", "type": "string"}]}
    )

    result = run(
        broker_url,
        *("read", "--topic", topic, "--option", "schema.type=JSON"),
        *("--option", f"schema.definition={definition}", "--path", str(tmp_path / "out")),
    )

    assert result.exit_code == 1
    where = f"({ids[1].ledger_id()}, {ids[1].entry_id()}, {ids[1].batch_index()})"
    assert result.stderr.startswith(
        f"Error: message {where} of {full(topic)} cannot be decoded with the topic's JSON schema"
    )
    assert len(result.stderr.splitlines()) == 1


def test_missing_broker_is_a_usage_error(tmp_path: Path) -> None:
    result = run(None, "read", "--topic", "t", "--path", str(tmp_path / "x"))

    assert result.exit_code == 2
    assert "no Pulsar broker given" in result.output
