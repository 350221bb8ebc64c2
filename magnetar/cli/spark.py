"""`magnetar spark read|replay`: topics into files, and functions over history, on Spark.

Both run a Spark application (``local[*]`` unless ``--master`` says otherwise) through the
``pulsar`` data source of :mod:`magnetar.spark_connector`, imported only when one of them
runs: PySpark takes a while to import, and every other `magnetar` command would pay for it.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import click

from magnetar.broker import BrokerError
from magnetar.broker_probe import check_broker
from magnetar.cli.render import emit_json, table
from magnetar.exceptions import MagnetarError
from magnetar.instance import FunctionConfig, InvalidFunctionConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from magnetar.cli.context import CliContext
    from magnetar.spark_connector import ReplayProgress, ReplayReport

__all__ = ["spark"]

_FILE_FORMATS = ("parquet", "json", "csv")
"""What ``magnetar.spark_connector.write_files`` writes."""

# The last "SomeError: text" line of a Python traceback Spark wraps in its own exception.
_PYTHON_ERROR = re.compile(r"^\s*(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$", re.MULTILINE)


@click.group()
def spark() -> None:
    """Read topics into files and replay functions over history, on Apache Spark."""


def _range_options(func: Any) -> Any:
    """The options choosing what to read, shared by read and replay."""
    options = [
        click.option(
            "--topic",
            "topics",
            multiple=True,
            help="Topic to read; repeat for several.",
        ),
        click.option(
            "--starting-offsets",
            help="earliest (default) or JSON {topic: [message id bytes]}, that message included.",
        ),
        click.option(
            "--ending-offsets",
            help="latest (default) or JSON {topic: [message id bytes]}, that message included.",
        ),
        click.option("--starting-time", type=int, help="Only messages published at or after (ms)."),
        click.option("--ending-time", type=int, help="Only messages published before (ms)."),
        click.option(
            "--option",
            "extra",
            multiple=True,
            metavar="KEY=VALUE",
            help="Another pulsar data source option (e.g. pulsar.client.authParams=...).",
        ),
        click.option(
            "--master",
            default="local[*]",
            show_default=True,
            help="Spark master URL.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@spark.command()
@_range_options
@click.option(
    "--format",
    "file_format",
    type=click.Choice(_FILE_FORMATS),
    default="parquet",
    show_default=True,
    help="Files to write; json and csv hold payloads and keys as text.",
)
@click.option(
    "--path",
    required=True,
    type=click.Path(file_okay=False),
    help="Directory to write (must not exist).",
)
@click.pass_context
def read(
    ctx: click.Context,
    *,
    topics: tuple[str, ...],
    starting_offsets: str | None,
    ending_offsets: str | None,
    starting_time: int | None,
    ending_time: int | None,
    extra: tuple[str, ...],
    master: str,
    file_format: str,
    path: str,
) -> None:
    """Read topics into files: one row per message, with the data source's columns.

    \b
    Example:
      magnetar --broker-url pulsar://localhost:6650 spark read --topic out \\
          --starting-offsets earliest --format parquet --path /tmp/out
    """
    obj: CliContext = ctx.obj
    if not topics:
        raise click.UsageError("pass --topic (repeat it for several topics)")
    options = _read_options(
        _broker_url(obj), topics, starting_offsets, ending_offsets, starting_time, ending_time
    )
    options.update(_key_values(extra))
    from magnetar.spark_connector import check_read_options, write_files

    with _spark_errors():
        check_read_options(options)  # before Spark takes seconds to start
    with _spark_errors(), _session(master, "magnetar-spark-read") as session:
        frame = session.read.format("pulsar").options(**options).load()
        write_files(frame, path, file_format)
        written = session.read.format(file_format).option("header", "true").load(path)
        per_topic = written.groupBy("__topic").count().collect()
    counts = {row["__topic"]: row["count"] for row in per_topic}
    total = sum(counts.values())
    if obj.output == "json":
        emit_json({"path": path, "format": file_format, "messages": total, "topics": counts})
    else:
        click.echo(table(["topic", "messages"], sorted(counts.items())))
        click.echo(f"{total:,} messages written to {path} ({file_format})")


@spark.command()
@click.option(
    "--fqfn",
    help="tenant/namespace/name of a registered function: its stored code and config, "
    "from the worker at --admin-url.",
)
@click.option("--py", type=click.Path(dir_okay=False), help="The function's .py file or .zip.")
@click.option("--classname", "class_name", help="module.ClassName or module.function.")
@click.option("--tenant", default="public", show_default=True)
@click.option("--namespace", default="default", show_default=True)
@click.option("--name", help="Function name [default: the class name].")
@click.option("--user-config", help="JSON map readable with context.get_user_config_value.")
@click.option("--output-serde-classname", help="SerDe class of the results.")
@_range_options
@click.option("--to-topic", help="Write the results to this topic (publishes go to their own).")
@click.option(
    "--path",
    type=click.Path(file_okay=False),
    help="Write the results as files in this directory instead.",
)
@click.option(
    "--format",
    "file_format",
    type=click.Choice(_FILE_FORMATS),
    default="parquet",
    show_default=True,
    help="Files written with --path.",
)
@click.pass_context
def replay(
    ctx: click.Context,
    *,
    fqfn: str | None,
    py: str | None,
    class_name: str | None,
    tenant: str,
    namespace: str,
    name: str | None,
    user_config: str | None,
    output_serde_classname: str | None,
    topics: tuple[str, ...],
    starting_offsets: str | None,
    ending_offsets: str | None,
    starting_time: int | None,
    ending_time: int | None,
    extra: tuple[str, ...],
    master: str,
    to_topic: str | None,
    path: str | None,
    file_format: str,
) -> None:
    """Run a function's code over a range of its input topics, on Spark.

    The function sees each message as the live instance would (same SerDes, a Context with
    the message's id, key, properties and event time). Its results carry the properties the
    live instance gives them; messages it publishes go to their own topics. Inputs whose
    processing raises are counted and reported, and the replay goes on. State is not
    available to a replayed function.

    With --fqfn the function registered on the worker at --admin-url is replayed with
    its stored code and config, over its own input topics unless --topic says otherwise.

    \b
    Examples:
      magnetar --broker-url pulsar://localhost:6650 spark replay \\
          --py examples/exclamation.py --classname exclamation.ExclamationFunction \\
          --topic in --to-topic in-replayed
      magnetar --broker-url pulsar://localhost:6650 --admin-url http://localhost:8080 \\
          spark replay --fqfn public/default/excl --path /tmp/excl-replayed
    """
    obj: CliContext = ctx.obj
    if (to_topic is None) == (path is None):
        raise click.UsageError("pass exactly one of --to-topic and --path")
    with ExitStack() as cleanup:
        if fqfn:
            if py or class_name or user_config or name:
                raise click.UsageError(
                    "--fqfn replays the registered function's code and config: leave out "
                    "--py, --classname, --name and --user-config"
                )
            work_dir = Path(cleanup.enter_context(tempfile.TemporaryDirectory()))
            config = _registered_config(obj, fqfn, work_dir)
            topics = topics or tuple(config.input_serdes())
        else:
            if not py:
                raise click.UsageError(
                    "pass --py (and --classname) with the function's code, or --fqfn"
                )
            if not topics:
                raise click.UsageError(
                    "pass --topic: the input topic to replay (repeat for several)"
                )
            config = _function_config(tenant, namespace, name, py, class_name, topics, user_config)
        if output_serde_classname:
            config = config.model_copy(update={"output_serde_class_name": output_serde_classname})
        _run_replay(
            obj,
            config,
            topics,
            (starting_offsets, ending_offsets, starting_time, ending_time),
            extra,
            master,
            to_topic,
            path,
            file_format,
        )


def _run_replay(
    obj: CliContext,
    config: FunctionConfig,
    topics: Sequence[str],
    bounds: tuple[str | None, str | None, int | None, int | None],
    extra: Sequence[str],
    master: str,
    to_topic: str | None,
    path: str | None,
    file_format: str,
) -> None:
    options = _read_options(_broker_url(obj), topics, *bounds)
    options.update(_key_values(extra))

    def show_progress(progress: ReplayProgress) -> None:
        click.echo(
            f"replay: {progress.tasks_done}/{progress.tasks_total} tasks done, "
            f"{progress.inputs:,} inputs processed by finished tasks",
            err=True,
        )

    from magnetar.spark_connector import check_read_options
    from magnetar.spark_connector import replay as run_replay

    with _spark_errors():
        check_read_options(options)  # before Spark takes seconds to start
    with _spark_errors(), _session(master, f"magnetar-replay-{config.name}") as session:
        report = run_replay(
            session,
            config,
            options,
            to_topic=to_topic,
            path=path,
            file_format=file_format,
            progress=show_progress,
        )
    _print_report(obj, report, to_topic or path or "")


def _registered_config(obj: CliContext, fqfn: str, work_dir: Path) -> FunctionConfig:
    """The FunctionConfig of a registered function, its code package downloaded into
    ``work_dir`` (Pulsar's ``GET .../functions/{t}/{ns}/{name}`` and ``.../download``)."""
    from magnetar.cli.admin import admin_client, resolve_fqfn

    fqfn = resolve_fqfn(None, None, None, fqfn)
    admin = admin_client(obj)
    stored = admin.get_json(f"/admin/v3/functions/{fqfn}")
    if stored.get("js") or str(stored.get("runtime", "")).upper() == "JAVASCRIPT":
        raise click.UsageError(
            f"{fqfn} is a JavaScript function; spark replay runs Python functions"
        )
    package = admin.request("GET", f"/admin/v3/functions/{fqfn}/download")
    filename = _attachment_name(package.headers.get("content-disposition", ""))
    code = work_dir / (filename or Path(str(stored.get("py") or "function.py")).name)
    code.write_bytes(package.content)
    try:
        config = FunctionConfig.parse(stored)
    except (InvalidFunctionConfigError, ValueError) as error:
        raise click.ClickException(f"the stored config of {fqfn} is not usable: {error}") from None
    return config.model_copy(update={"py": str(code)})


def _attachment_name(disposition: str) -> str | None:
    """The file name in a ``Content-Disposition`` header, without any directory."""
    found = re.search(r"filename\*?=(?:UTF-8'')?\"?([^\";]+)", disposition)
    return Path(unquote(found.group(1))).name if found else None


def _broker_url(obj: CliContext) -> str:
    if not obj.broker_url:
        raise click.UsageError(
            "no Pulsar broker given: pass --broker-url (e.g. pulsar://localhost:6650) "
            "or set MAGNETAR_BROKER_URL"
        )
    try:
        check_broker(obj.broker_url, 5.0)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--broker-url") from None
    except BrokerError as error:
        raise click.ClickException(str(error)) from None
    return obj.broker_url


def _read_options(
    broker_url: str,
    topics: Sequence[str],
    starting_offsets: str | None,
    ending_offsets: str | None,
    starting_time: int | None,
    ending_time: int | None,
) -> dict[str, str]:
    options = {"service.url": broker_url, "topics": ",".join(topics)}
    given = {
        "startingOffsets": starting_offsets,
        "endingOffsets": ending_offsets,
        "startingTime": starting_time,
        "endingTime": ending_time,
    }
    options.update({key: str(value) for key, value in given.items() if value is not None})
    return options


def _key_values(items: Sequence[str]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--option")
        pairs[key] = value
    return pairs


def _function_config(
    tenant: str,
    namespace: str,
    name: str | None,
    py: str,
    class_name: str | None,
    topics: Sequence[str],
    user_config: str | None,
) -> FunctionConfig:
    try:
        settings = json.loads(user_config) if user_config else {}
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"must be JSON: {error}", param_hint="--user-config") from None
    if not isinstance(settings, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--user-config")
    default_name = class_name.rsplit(".", 1)[-1] if class_name else Path(py).stem
    try:
        return FunctionConfig(
            tenant=tenant,
            namespace=namespace,
            name=name or default_name,
            py=str(Path(py).expanduser().resolve()),
            class_name=class_name,
            inputs=list(topics),
            user_config=settings,
        )
    except (InvalidFunctionConfigError, ValueError) as error:
        raise click.UsageError(str(error)) from None


@contextmanager
def _session(master: str, app_name: str) -> Iterator[SparkSession]:
    """A new session stopped at the end; or the caller's, when one is active, left running."""
    from pyspark.sql import SparkSession

    from magnetar.spark_connector import spark_session

    active = SparkSession.getActiveSession()
    session = spark_session(master, app_name, {"spark.ui.showConsoleProgress": "false"})
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        if active is None:
            session.stop()


@contextmanager
def _spark_errors() -> Iterator[None]:
    """Our errors as one line, whether raised here or inside a Spark job."""
    try:
        yield
    except MagnetarError as error:
        raise click.ClickException(str(error)) from None
    except Exception as error:
        if type(error).__module__.startswith(("pyspark", "py4j")):
            raise click.ClickException(_spark_error_text(error)) from None
        raise


def _spark_error_text(error: Exception) -> str:
    """The Python error inside a Spark error (ours without its class name, as when raised
    here), else Spark's first line."""
    from magnetar.spark_connector import exceptions

    text = str(error)
    found = _PYTHON_ERROR.findall(text)
    if found:
        kind, message = found[-1]
        return message if kind in exceptions.__all__ else f"{kind}: {message}"
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


def _print_report(obj: CliContext, report: ReplayReport, destination: str) -> None:
    if obj.output == "json":
        emit_json(
            {
                "inputs": report.inputs,
                "outputs": report.outputs,
                "published": report.published,
                "userExceptions": report.user_exceptions,
                "systemExceptions": report.system_exceptions,
                "latestExceptions": list(report.latest_exceptions),
                "destination": destination,
            }
        )
        return
    rows = [
        ("inputs", report.inputs),
        ("outputs", report.outputs),
        ("published", report.published),
        ("user exceptions", report.user_exceptions),
        ("system exceptions", report.system_exceptions),
    ]
    click.echo(table(["replay", "messages"], rows))
    for line in report.latest_exceptions:
        click.echo(f"  failed: {line}")
    click.echo(f"results written to {destination}")
