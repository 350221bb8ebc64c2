"""Analytics on functions' output and state with Spark SQL: the most frequent words.

A notebook-style script (each ``# %%`` is a cell in VS Code / Jupytext). It reads two things
with the ``pulsar`` data source and aggregates them with Spark SQL:

* the output topic of the word-split function (examples/word_split.py): one message a word;
* the state journal of the word-count function (examples/word_count.py): every
  ``incr_counter`` it made, as the journal records them; summed, they are its counters.

    python examples/analytics/word_counts.py                       # self-contained demo
    python examples/analytics/word_counts.py --broker-url pulsar://localhost:6650 \
        --topic words --function public/default/word_count        # your own functions

Without --broker-url it starts the embedded broker, sends a few sentences and runs both
functions on them first, so there is something to analyse.
"""

# %% Setup
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pulsar
from pyspark.sql.functions import explode, udf
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from magnetar.broker import EmbeddedBroker
from magnetar.instance import FunctionConfig, FunctionInstance
from magnetar.spark_connector import spark_session
from magnetar.statestore import INCR, JournaledStateStore, StateOptions, decode_message
from magnetar.statestore import journal_topic as state_journal_topic

EXAMPLES = Path(__file__).resolve().parent.parent
SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "the dog sleeps",
    "a fox is quick and the dog is lazy",
]

parser = argparse.ArgumentParser(description="Word counts from a function's output topic.")
parser.add_argument("--broker-url", help="Pulsar service URL; default: an embedded broker")
parser.add_argument("--topic", default="words", help="The word-split function's output topic")
parser.add_argument(
    "--function", default="public/default/word_count", help="The word-count function's FQFN"
)
parser.add_argument(
    "--system-namespace", default="public/magnetar", help="Where the state journals are"
)
args = parser.parse_args()
journal = state_journal_topic(args.function, args.system_namespace)

broker = None
if args.broker_url is None:
    broker = EmbeddedBroker(tempfile.mkdtemp(prefix="magnetar-analytics-")).start()
broker_url = args.broker_url or broker.service_url

# %% Demo data: sentences through both functions (only without --broker-url)
if broker is not None:
    client = pulsar.Client(broker_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer("sentences")
    for sentence in SENTENCES * 10:
        producer.send(sentence.encode())
    producer.close()
    tenant, namespace, name = args.function.split("/")
    split = FunctionConfig(
        name="word-split",
        py=str(EXAMPLES / "word_split.py"),
        class_name="word_split.WordSplitFunction",
        inputs=["sentences"],
        output=args.topic,
        subscription_position="Earliest",
    )
    count = FunctionConfig(
        tenant=tenant,
        namespace=namespace,
        name=name,
        py=str(EXAMPLES / "word_count.py"),
        class_name="word_count.WordCountFunction",
        inputs=["sentences"],
        subscription_position="Earliest",
    )
    state = JournaledStateStore(
        client,
        args.function,
        StateOptions(tempfile.mkdtemp(prefix="magnetar-state-"), args.system_namespace),
    )
    instances = [
        FunctionInstance(split, client).start(),
        FunctionInstance(count, client, state=state).start(),
    ]
    while any(i.metrics.processed < len(SENTENCES) * 10 for i in instances):
        time.sleep(0.05)
    for instance in instances:
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

# %% The word-count function's state journal: its increments, summed per word
INCREMENTS = ArrayType(
    StructType([StructField("word", StringType()), StructField("amount", LongType())])
)


@udf(INCREMENTS)
def increments(payload):  # no type hints: PySpark would read them as a pandas UDF
    """The counter increments in one journal message."""
    message = decode_message(bytes(payload))
    return [
        (key.decode(), amount)
        for record in message.records
        for kind, key, amount in record.ops
        if kind == INCR
    ]


(
    spark.read.format("pulsar")
    .option("service.url", broker_url)
    .option("topic", journal)
    .option("startingOffsets", "earliest")
    .load()
    .select(explode(increments("value")).alias("update"))
    .select("update.word", "update.amount")
    .createOrReplaceTempView("increments")
)
# The counters from the journal agree with the words counted on the output topic.
spark.sql(
    """
    SELECT i.word, i.counter, w.occurrences
    FROM (SELECT word, SUM(amount) AS counter FROM increments GROUP BY word) i
    LEFT JOIN (SELECT CAST(value AS STRING) AS word, COUNT(*) AS occurrences
               FROM words GROUP BY CAST(value AS STRING)) w
    ON i.word = w.word
    ORDER BY i.counter DESC, i.word
    LIMIT 10
    """
).show(truncate=False)

# %% Clean up
spark.stop()
if broker is not None:
    broker.stop()
