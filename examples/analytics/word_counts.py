"""Analytics on a function's output with Spark SQL: the most frequent words.

A notebook-style script (each ``# %%`` is a cell in VS Code / Jupytext). It reads the output
topic of the word-split function (examples/word_split.py) with the ``pulsar`` data source and
aggregates it with Spark SQL.

    python examples/analytics/word_counts.py                       # self-contained demo
    python examples/analytics/word_counts.py --broker-url pulsar://localhost:6650 \
        --topic words                                               # your own output topic

Without --broker-url it starts the embedded broker, sends a few sentences and runs the
word-split function on them first, so there is something to analyse.

The function's state journal (``persistent://public/functions/state-...``) is not read here
yet: it lands with the state store.
"""

# %% Setup
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pulsar

from magnetar.broker import EmbeddedBroker
from magnetar.instance import FunctionConfig, FunctionInstance
from magnetar.spark_connector import spark_session

EXAMPLES = Path(__file__).resolve().parent.parent
SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "the dog sleeps",
    "a fox is quick and the dog is lazy",
]

parser = argparse.ArgumentParser(description="Word counts from a function's output topic.")
parser.add_argument("--broker-url", help="Pulsar service URL; default: an embedded broker")
parser.add_argument("--topic", default="words", help="The function's output topic")
args = parser.parse_args()

broker = None
if args.broker_url is None:
    broker = EmbeddedBroker(tempfile.mkdtemp(prefix="magnetar-analytics-")).start()
broker_url = args.broker_url or broker.service_url

# %% Demo data: sentences through the word-split function (only without --broker-url)
if broker is not None:
    client = pulsar.Client(broker_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer("sentences")
    for sentence in SENTENCES * 10:
        producer.send(sentence.encode())
    producer.close()
    instance = FunctionInstance(
        FunctionConfig(
            name="word-split",
            py=str(EXAMPLES / "word_split.py"),
            class_name="word_split.WordSplitFunction",
            inputs=["sentences"],
            output=args.topic,
            subscription_position="Earliest",
        ),
        client,
    ).start()
    while instance.metrics.processed < len(SENTENCES) * 10:
        time.sleep(0.05)
    instance.stop()
    instance.wait(30)
    client.close()

# %% Read the output topic into a DataFrame
spark = spark_session(
    "local[*]", "magnetar-analytics", {"spark.ui.showConsoleProgress": "false"}
)
spark.sparkContext.setLogLevel("ERROR")
words = (
    spark.read.format("pulsar")
    .option("service.url", broker_url)
    .option("topic", args.topic)
    .option("startingOffsets", "earliest")
    .load()
)
words.createOrReplaceTempView("words")

# %% The aggregate, in Spark SQL
top = spark.sql(
    """
    SELECT CAST(value AS STRING) AS word, COUNT(*) AS occurrences
    FROM words
    GROUP BY CAST(value AS STRING)
    ORDER BY occurrences DESC, word
    LIMIT 10
    """
)
top.show(truncate=False)

# %% Output per minute of publish time
spark.sql(
    """
    SELECT window(__publishTime, '1 minute').start AS minute, COUNT(*) AS words
    FROM words
    GROUP BY window(__publishTime, '1 minute')
    ORDER BY minute
    """
).show(truncate=False)

# %% Clean up
spark.stop()
if broker is not None:
    broker.stop()
