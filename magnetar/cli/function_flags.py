"""The FunctionConfig flags of `pulsar-admin functions` (shared by localrun, create, update).

Flags become FunctionConfig fields (Pulsar's camelCase names) over a ``--function-config-file``
(JSON or YAML); only flags that were given count, so ``update`` changes just those fields.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # imported when used: `magnetar functions list` needs no pydantic
    from magnetar.instance.config import FunctionConfig

__all__ = [
    "config_fields",
    "config_from_flags",
    "function_config_options",
    "is_url",
    "with_default_name",
]

_URL_SCHEMES = ("http://", "https://", "file://")


def function_config_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add the FunctionConfig flags (all but the function's identity) to ``command``."""
    options = [
        click.option(
            "--function-config-file",
            type=click.Path(dir_okay=False),
            help="JSON or YAML FunctionConfig; flags override its fields.",
        ),
        click.option(
            "--py", help="The function's .py file or .zip package (or an http(s)/file URL)."
        ),
        click.option(
            "--js", help="The function's .js script (runtime JAVASCRIPT), instead of --py."
        ),
        click.option(
            "--classname",
            "class_name",
            help="module.ClassName or module.function (for --js: the script's function).",
        ),
        click.option("-i", "--inputs", help="Comma-separated input topics."),
        click.option("--topics-pattern", help="Regex of input topics."),
        click.option("-o", "--output", help="Output topic."),
        click.option("--log-topic", help="Topic the function's logs are published to."),
        click.option("--parallelism", type=int, help="Number of instances [default: 1]."),
        click.option(
            "--processing-guarantees",
            type=click.Choice(["ATLEAST_ONCE", "ATMOST_ONCE", "EFFECTIVELY_ONCE", "MANUAL"]),
            help="Delivery semantics [default: ATLEAST_ONCE].",
        ),
        click.option("--user-config", help="JSON map readable with context.get_user_config_value."),
        click.option("--secrets", help="JSON map of secret name to locator."),
        click.option("--subs-name", "sub_name", help="Subscription name [default: the FQFN]."),
        click.option(
            "--subs-position",
            "subscription_position",
            type=click.Choice(["Latest", "Earliest"]),
            help="Where a new subscription starts [default: Latest].",
        ),
        click.option("--retain-ordering", is_flag=True, default=None, help="Process in order."),
        click.option(
            "--retain-key-ordering", is_flag=True, default=None, help="Process each key in order."
        ),
        click.option("--max-message-retries", type=int, help="Redeliveries before dead-lettering."),
        click.option("--dead-letter-topic", help="Topic for messages that exhaust their retries."),
        click.option("--timeout-ms", type=int, help="Upper bound of one invocation, in ms."),
        click.option("--auto-ack", help="true or false [default: true]."),
        click.option("--custom-serde-inputs", help="JSON map of input topic to SerDe class."),
        click.option(
            "--output-serde-classname",
            "output_serde_class_name",
            help="SerDe class for the output.",
        ),
        click.option("--cpu", type=float, help="CPU cores per instance (recorded, as Pulsar's)."),
        click.option("--ram", type=int, help="Bytes of RAM per instance (recorded)."),
        click.option("--disk", type=int, help="Bytes of disk per instance (recorded)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def is_url(value: str) -> bool:
    """Whether a --py value names a package URL rather than a local file."""
    return value.startswith(_URL_SCHEMES)


def config_fields(function_config_file: str | None, **flags: Any) -> dict[str, Any]:
    """FunctionConfig fields (camelCase) from the config file overlaid with the given flags."""
    from pydantic.alias_generators import to_camel

    from magnetar.instance.config import load_config_file

    data: dict[str, Any] = load_config_file(function_config_file) if function_config_file else {}
    inputs = flags.pop("inputs", None)
    if inputs:
        data["inputs"] = [t.strip() for t in inputs.split(",") if t.strip()]
    json_flags = {
        "user_config": "--user-config",
        "secrets": "--secrets",
        "custom_serde_inputs": "--custom-serde-inputs",
    }
    for field, flag in json_flags.items():
        value = _json_option(flags.pop(field, None), flag)
        if value is not None:
            data[to_camel(field)] = value
    auto_ack = _bool_option(flags.pop("auto_ack", None), "--auto-ack")
    if auto_ack is not None:
        data["autoAck"] = auto_ack
    resources = {
        key: value for key in ("cpu", "ram", "disk") if (value := flags.pop(key, None)) is not None
    }
    if resources:
        data["resources"] = {**data.get("resources", {}), **resources}
    for field, value in flags.items():
        if value is not None and value is not False:
            data[to_camel(field)] = value
    if data.get("py") and not is_url(data["py"]):
        data["py"] = str(Path(data["py"]).expanduser().resolve())
    if data.get("js") and not is_url(data["js"]):
        data["js"] = str(Path(data["js"]).expanduser().resolve())
    return data


def config_from_flags(function_config_file: str | None, **flags: Any) -> FunctionConfig:
    """The validated FunctionConfig from the config file overlaid with the given flags."""
    from magnetar.instance.config import FunctionConfig

    return FunctionConfig.parse(config_fields(function_config_file, **flags))


def with_default_name(config: FunctionConfig) -> FunctionConfig:
    """The config, named after its class or file when it has no name (as pulsar-admin does)."""
    if config.name:
        return config
    if config.js:  # a script's functions are named process: the file names it better
        name = Path(config.js).stem
    elif config.class_name:
        name = config.class_name.rsplit(".", 1)[-1]
    elif config.py:
        name = Path(config.py).stem
    else:
        raise click.UsageError("pass --name, --classname, --py or --js")
    return config.model_copy(update={"name": name})


def _json_option(value: str | None, flag: str) -> Any:
    if value is None:
        return None
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise click.BadParameter(f"{flag} must be JSON: {error}") from None


def _bool_option(value: str | None, flag: str) -> bool | None:
    if value is None:
        return None
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise click.BadParameter(f"{flag} takes true or false, not {value!r}")
    return lowered == "true"
