"""Functions in each convention of Apache Pulsar's ``pulsar-functions/python-examples`` (our own
code, written the way those examples are), with the config Apache runs them with and the
output Apache gives: the same table drives localrun and a worker cluster.

Topic names in a config or an expectation are templates: ``{in}``, ``{out}``, ``{side}``,
``{log}`` and ``{dlq}`` become the topics of one run.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

_TOPICS = ("in", "out", "side", "log", "dlq")
OUTPUTS = _TOPICS[1:]
"""The topics a function may write to."""


@dataclass(frozen=True)
class Convention:
    """One function, how it is configured, what it is given and what comes out."""

    name: str
    code: str
    """A file of this folder, ``zip:module`` / ``zip:package`` for a built zip, or
    ``whl:module`` for a built wheel."""
    class_name: str
    inputs: list[str]
    expected: dict[str, list[str]]
    """Topic template -> the values published there, in order (``log``: regexes)."""
    config: dict[str, Any] = field(default_factory=dict)
    """FunctionConfig fields (Pulsar's names), topic templates allowed in values."""
    needs_state: bool = False

    def topics(self, prefix: str) -> dict[str, str]:
        return {key: f"{prefix}-{self.name}-{key}" for key in _TOPICS}

    def function_config(self, prefix: str) -> dict[str, Any]:
        """The FunctionConfig fields of one run (inputs and output included)."""
        topics = self.topics(prefix)
        config: dict[str, Any] = {
            "className": self.class_name,
            "inputs": [topics["in"]],
            "output": topics["out"],
            "subscriptionPosition": "Earliest",
        }
        return {**config, **_fill(self.config, topics)}

    def package(self, directory: Path) -> Path:
        """The code file to run (a zip is built in ``directory``)."""
        if self.code == "zip:module":
            return _zip(
                directory / "exclamation.zip",
                {"exclamation/src/exclamation.py": "def process(input):\n    return input + '!'\n"},
            )
        if self.code == "zip:package":
            return _zip(
                directory / "shouting.zip",
                {
                    "shouting/src/shouting/__init__.py": "",
                    "shouting/src/shouting/handlers.py": (
                        "from pulsar import Function\n\n\n"
                        "class Upper(Function):\n"
                        "    def process(self, input, context):\n"
                        "        return input.upper()\n"
                    ),
                },
            )
        if self.code == "whl:module":
            from tests.wheels import make_wheel

            return make_wheel(
                directory,
                "wheeled",
                {"wheeled.py": "def process(input):\n    return input + '?!'\n"},
            )
        return HERE / self.code

    def matches(self, key: str, values: list[str]) -> bool:
        expected = self.expected.get(key, [])
        if key == "log":
            return len(values) == len(expected) and all(
                re.fullmatch(pattern, value)
                for pattern, value in zip(expected, values, strict=True)
            )
        return values == expected


def _fill(value: Any, topics: dict[str, str]) -> Any:
    if isinstance(value, str):
        return value.format_map(topics) if "{" in value else value
    if isinstance(value, dict):
        return {_fill(k, topics): _fill(v, topics) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, topics) for v in value]
    return value


def _zip(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


_LOG_LINE = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}\] \[INFO\]: saw "

CONVENTIONS = [
    Convention("native", "native_module.py", "native_module", ["a", "b"], {"out": ["a!", "b!"]}),
    Convention(
        "class", "class_function.py", "class_function.Exclaim", ["a", "b"], {"out": ["a!", "b!"]}
    ),
    Convention(
        "userconfig",
        "user_config_append.py",
        "user_config_append.Append",
        ["a", "b"],
        {"out": ["a?", "b?"]},
        {"userConfig": {"suffix": "?"}},
    ),
    Convention(
        "publish",
        "publishing.py",
        "publishing.Publish",
        ["a", "b"],
        {"side": ["a!", "b!"]},
        {"userConfig": {"publish-topic": "{side}"}},
    ),
    Convention(
        "logging",
        "logging_fn.py",
        "logging_fn.Log",
        ["a", "b"],
        {"out": ["a", "b"], "log": [_LOG_LINE + "a", _LOG_LINE + "b"]},
        {"logTopic": "{log}"},
    ),
    Convention(
        "serde",
        "pair_serde.py",
        "pair_serde.Shift",
        ["1,2", "10,20"],
        {"out": ["12,26", "21,44"]},
        {
            "customSerdeInputs": {"{in}": "pair_serde.PairSerDe"},
            "outputSerdeClassName": "pair_serde.PairSerDe",
        },
    ),
    Convention(
        "state",
        "counting.py",
        "counting.CountWords",
        ["a b", "a"],
        {"out": ["a=1,b=1", "a=2"]},
        needs_state=True,
    ),
    Convention(
        "secrets",
        "secret_reader.py",
        "secret_reader.Secret",
        ["a"],
        {"out": ["alice!"]},
        {"secrets": {"username": "alice"}},
    ),
    Convention(
        "raises",
        "raises.py",
        "raises.Raise",
        ["a"],
        {"dlq": ["a"]},
        {"maxMessageRetries": 1, "deadLetterTopic": "{dlq}"},
    ),
    Convention("void", "void_fn.py", "void_fn.Void", ["a"], {}, needs_state=True),
    Convention("zipmodule", "zip:module", "exclamation", ["a"], {"out": ["a!"]}),
    Convention("zippackage", "zip:package", "shouting.handlers.Upper", ["a"], {"out": ["A"]}),
    Convention("wheel", "whl:module", "wheeled", ["a"], {"out": ["a?!"]}),
]
"""Every convention; ``expected`` lists every topic that receives anything."""


def check_all(client: Any, prefix: str, timeout_s: float) -> dict[str, dict[str, list[str]]]:
    """Wait until every convention has published what Apache gives (then a moment more, for
    anything extra); returns the mismatches, by convention (empty when all match)."""
    import time

    import pulsar

    # One reader per topic, fed as messages arrive: no poll waits out a read timeout.
    seen = {c.name: {key: list[str]() for key in OUTPUTS} for c in CONVENTIONS}
    readers = [
        client.create_reader(
            convention.topics(prefix)[key],
            pulsar.MessageId.earliest,
            reader_listener=lambda _, message, values=seen[convention.name][key]: values.append(
                message.data().decode()
            ),
        )
        for convention in CONVENTIONS
        for key in OUTPUTS
    ]
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not all(
            len(seen[c.name][key]) >= len(c.expected.get(key, []))
            for c in CONVENTIONS
            for key in OUTPUTS
        ):
            time.sleep(0.2)
        time.sleep(1.0)
    finally:
        for reader in readers:
            reader.close()
    return {
        c.name: seen[c.name]
        for c in CONVENTIONS
        if not all(c.matches(key, seen[c.name][key]) for key in OUTPUTS)
    }
