"""JavaScript functions on V8 (through mini-racer): ``function process(input, context)``.

One V8 context per instance, a per-message time limit and a heap limit, no host access. A
chunk of messages crosses into V8 in one call (see ``_executor``); the context's effects come
back with the results (see ``_prelude``).
"""

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
    check_script,
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
