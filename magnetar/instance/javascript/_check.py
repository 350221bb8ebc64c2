"""Checking a script without running it on a message: a V8 context of its own that loads
the script (running its top level) and is dropped. Light on purpose (V8 and the runtime
prelude only): a worker runs it in a process of its own for every submitted script
(``check_process``)."""

from __future__ import annotations

from typing import Any

from magnetar.instance.exceptions import FunctionLoadError
from magnetar.instance.javascript._engine import (
    DEFAULT_MEMORY_LIMIT_BYTES,
    DEFAULT_TIMEOUT_MS,
    ScriptEngine,
)

__all__ = ["check_script"]


def check_script(
    source: str | bytes,
    filename: str,
    function_name: str | None = None,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
) -> None:
    """Load a script in a context of its own and drop it: FunctionLoadError for a syntax
    error (line and column), a throwing or runaway top level, or a missing function.

    V8, as mini-racer embeds it, crashes a process holding contexts on several threads at
    once: a worker checks each script in a process of its own (``worker.script_check``)."""
    if isinstance(source, bytes):
        try:
            source = source.decode("utf-8")
        except UnicodeDecodeError as error:
            raise FunctionLoadError(
                f"function script {filename} is not UTF-8 text: {error}"
            ) from None
    engine = ScriptEngine(
        source, filename, function_name, _settings_for_check(), timeout_ms, memory_limit_bytes
    )
    engine.close()


def _settings_for_check() -> dict[str, Any]:
    return {
        "name": "check",
        "tenant": "public",
        "namespace": "default",
        "instanceId": 0,
        "inputTopics": [],
        "outputTopic": None,
        "userConfig": {},
        "secrets": {},
        "stateEnabled": False,
        "stateError": "",
        "outputJson": False,
        "stopOnError": False,
        "urlBindings": [],
    }
