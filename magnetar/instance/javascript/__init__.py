"""JavaScript functions on V8 (through mini-racer): ``function process(input, context)``.

One V8 context per instance, a per-message time limit and a heap limit, no host access. A
chunk of messages crosses into V8 in one call (see ``_executor``); the context's effects come
back with the results (see ``_prelude``).

Names are imported when first used (PEP 562): a script check loads V8 and the prelude only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from magnetar.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from magnetar.instance.javascript._check import check_script
    from magnetar.instance.javascript._engine import (
        DEFAULT_MEMORY_LIMIT_BYTES,
        DEFAULT_TIMEOUT_MS,
        read_script,
    )
    from magnetar.instance.javascript._executor import (
        ScriptExecutor,
        ScriptOutcome,
        ScriptRun,
        TimerFiring,
    )
    from magnetar.instance.javascript._loader import (
        check_script_file,
        open_executor,
        script_limits,
    )

__all__ = [
    "DEFAULT_MEMORY_LIMIT_BYTES",
    "DEFAULT_TIMEOUT_MS",
    "ScriptExecutor",
    "ScriptOutcome",
    "ScriptRun",
    "TimerFiring",
    "check_script",
    "check_script_file",
    "open_executor",
    "read_script",
    "script_limits",
]

_HOMES = {
    "DEFAULT_MEMORY_LIMIT_BYTES": "magnetar.instance.javascript._engine",
    "DEFAULT_TIMEOUT_MS": "magnetar.instance.javascript._engine",
    "read_script": "magnetar.instance.javascript._engine",
    "ScriptExecutor": "magnetar.instance.javascript._executor",
    "ScriptOutcome": "magnetar.instance.javascript._executor",
    "ScriptRun": "magnetar.instance.javascript._executor",
    "TimerFiring": "magnetar.instance.javascript._executor",
    "check_script": "magnetar.instance.javascript._check",
    "check_script_file": "magnetar.instance.javascript._loader",
    "open_executor": "magnetar.instance.javascript._loader",
    "script_limits": "magnetar.instance.javascript._loader",
}


__getattr__ = lazy_exports(globals(), _HOMES)
