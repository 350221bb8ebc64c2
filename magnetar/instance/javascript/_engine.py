"""One V8 context (through mini-racer) holding a user's script and the runtime prelude.

Loading reports what is wrong with a script the way Python's loader does: a syntax error
with its line and column, an exception or a runaway loop in the top-level code, a missing
function. Calls run with a time limit (mini-racer terminates V8 execution when it passes) and
under a hard heap limit; either interruption is returned, not raised, so the executor can
find out where the batch stopped. The context has no host access: V8 alone has no
``require``, filesystem or network, and the prelude's timers only say why there are none.

Each call is one task on the context's V8 thread, answered as ``_v8_context`` describes,
with a time limit added: on timeout the task is cancelled, and V8 then answers it exactly once
with "execution terminated".
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from py_mini_racer import JSEvalException, JSOOMException, JSParseException
from py_mini_racer._value_handle import ValueHandle

from magnetar.instance.config import LONGEST_TIME_LIMIT_S
from magnetar.instance.exceptions import FunctionLoadError, InstanceError
from magnetar.instance.javascript._curl_runtime import CURL_RUNTIME
from magnetar.instance.javascript._prelude import PRELUDE, RUNTIME_GLOBAL
from magnetar.instance.javascript._v8_context import V8Context, open_v8_context

__all__ = [
    "DEFAULT_MEMORY_LIMIT_BYTES",
    "DEFAULT_TIMEOUT_MS",
    "Interruption",
    "ScriptEngine",
    "read_script",
]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_MS = 10_000
"""Per-message time limit of a JavaScript function without ``timeoutMs``."""
DEFAULT_MEMORY_LIMIT_BYTES = 256 * 1024 * 1024
"""V8 heap limit of an instance without ``resources.ram``."""
_TERMINATION_WAIT_S = 10.0
"""How long V8 may take to stop a call that ran past its time limit."""
_HEAP_LEFT_AFTER_GC = 0.9  # above this share of the limit after a GC, the heap is leaking
_FUNCTION_NAME = re.compile(r"[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)*")
_PARSE_HEADER = re.compile(r"^.*?:(\d+): (SyntaxError: .*)$")


class Interruption(enum.Enum):
    """Why V8 stopped a call before it returned."""

    TIMEOUT = "timeout"
    MEMORY = "memory"


def read_script(path: str | Path) -> str:
    """The text of a ``.js`` file, or a FunctionLoadError saying why not."""
    path = Path(path).expanduser()
    if path.suffix != ".js":
        raise FunctionLoadError(f"function script {path} must be a .js file")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FunctionLoadError(f"function script {path} does not exist") from None
    except UnicodeDecodeError as error:
        raise FunctionLoadError(f"function script {path} is not UTF-8 text: {error}") from None
    except OSError as error:
        raise FunctionLoadError(f"cannot read function script {path}: {error.strerror}") from None


class ScriptEngine:
    """A V8 context running one script; ``function_name`` is what each message calls."""

    def __init__(
        self,
        source: str,
        filename: str,
        function_name: str | None,
        settings: dict[str, Any],
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
    ) -> None:
        self.filename = filename
        self.memory_limit_bytes = memory_limit_bytes
        self._v8: V8Context | None = open_v8_context()
        self._packed_run: ValueHandle | None = None
        self._no_arguments: ValueHandle | None = None
        """Held for the context's life: what every call of ``run`` passes to V8."""
        try:
            self._v8.context.set_hard_memory_limit(memory_limit_bytes)
            self._eval(PRELUDE)
            self._eval(CURL_RUNTIME)
            self._packed_run = self._eval(f"{RUNTIME_GLOBAL}.runPacked").raw_handle
            self._no_arguments = self._eval("[]").raw_handle
            before = set(self._global_names())
            self._run_top_level(source, timeout_ms)
            self.load_logs = self._bind(function_name or "process", settings, before)
        except BaseException:
            self.close()
            raise

    def _eval(self, code: str, timeout_s: float = 60.0) -> Any:
        """Evaluate ``code`` in V8; TimeoutError when it runs too long."""
        v8 = self._v8
        assert v8 is not None, "the engine is closed"
        context = v8.context
        code_handle = context._python_to_value_handle(code)
        task = context._dll.mr_eval(context._ctx, code_handle.raw, v8.callback_id)
        return self._answer(task, timeout_s)

    def _run_packed(self, arguments: str, timeout_s: float) -> Any:
        """The runtime's ``run`` with ``arguments`` (their JSON array) as ``runPacked``'s
        ``this``: a call of a function V8 compiled once, where evaluating a call's source
        compiled it anew every time (a new source each call), half of a call's 40 us."""
        v8 = self._v8
        assert v8 is not None, "the engine is closed"
        assert self._packed_run is not None and self._no_arguments is not None
        context = v8.context
        this = context._python_to_value_handle(arguments)
        task = context._dll.mr_call_function(
            context._ctx, self._packed_run.raw, this.raw, self._no_arguments.raw, v8.callback_id
        )
        try:
            return self._answer(task, timeout_s)
        except JSEvalException as error:
            # mini-racer names the heap limit's stop only for an evaluation; a call stopped so
            # answers a bare exception. Its evaluations tell by this flag too.
            if context.was_hard_memory_limit_reached():
                raise JSOOMException(str(error)) from None
            raise

    def _answer(self, task: int, timeout_s: float) -> Any:
        """The answer of the V8 task ``task``; TimeoutError when it runs too long."""
        v8 = self._v8
        assert v8 is not None
        context = v8.context
        answer = v8.wait(min(timeout_s, LONGEST_TIME_LIMIT_S))
        if answer is None:
            context._dll.mr_cancel_task(context._ctx, task)
            # its result or "execution terminated": dropped either way
            answer = v8.wait(_TERMINATION_WAIT_S)
            if answer is None:
                raise InstanceError(
                    f"V8 did not stop {self.filename} within {_TERMINATION_WAIT_S:.0f} s of "
                    "its time limit; the instance restarts with a fresh context"
                )
            with contextlib.suppress(Exception):
                context._value_handle_to_python(answer)
            raise TimeoutError
        return context._value_handle_to_python(answer)

    def _run_top_level(self, source: str, timeout_ms: int) -> None:
        # sourceURL names the file in stack traces; on a line of its own after the code
        try:
            self._eval(f"{source}\n//# sourceURL={self.filename}", timeout_ms / 1000)
        except JSParseException as error:
            raise FunctionLoadError(syntax_error(self.filename, str(error), source)) from None
        except TimeoutError:
            raise FunctionLoadError(
                f"the top-level code of {self.filename} ran longer than {timeout_ms} ms"
            ) from None
        except JSOOMException:
            raise FunctionLoadError(
                f"the top-level code of {self.filename} exceeded the memory limit of "
                f"{self.memory_limit_bytes // (1024 * 1024)} MiB"
            ) from None
        except JSEvalException as error:
            raise FunctionLoadError(
                f"the top-level code of {self.filename} threw: {_thrown(str(error))}"
            ) from None

    def _global_names(self) -> list[str]:
        names = self._eval("JSON.stringify(Object.getOwnPropertyNames(globalThis))")
        return list(json.loads(str(names)))

    def _bind(self, name: str, settings: dict[str, Any], before: set[str]) -> list[list[Any]]:
        if not _FUNCTION_NAME.fullmatch(name):
            raise FunctionLoadError(
                f"--classname {name!r} must name a function of the script, such as process"
            )
        probe = (
            f"(function () {{ try {{ return typeof ({name}); }} catch (e) {{ return ''; }} }})()"
        )
        if self._eval(probe) != "function":
            defined = sorted(
                n
                for n in set(self._global_names()) - before
                if self._eval(f"typeof globalThis[{json.dumps(n)}]") == "function"
            )
            raise FunctionLoadError(
                f"{self.filename} defines no function {name!r}; it defines: "
                f"{', '.join(defined) or 'no global functions'} (write function process(input, "
                "context) { ... }, or pass --classname)"
            )
        logs = self._eval(f"{RUNTIME_GLOBAL}.bind({name}, {json.dumps(settings)})")
        return list(json.loads(str(logs)))

    def run(self, arguments: str, timeout_s: float) -> str | Interruption:
        """The runtime's ``run`` with ``arguments``, the JSON array of its arguments: its JSON
        answer, or an Interruption, as ``call``."""
        return self._interrupted(self._run_packed, arguments, timeout_s)

    def call(self, code: str, timeout_s: float) -> str | Interruption:
        """Evaluate ``code`` (a runtime call answering JSON); an Interruption when V8 stopped
        it. Anything else going wrong in V8 is the runtime's fault: InstanceError."""
        return self._interrupted(self._eval, code, timeout_s)

    def _interrupted(
        self, start: Callable[[str, float], Any], text: str, timeout_s: float
    ) -> str | Interruption:
        try:
            return str(start(text, timeout_s))
        except TimeoutError:
            return Interruption.TIMEOUT
        except JSOOMException:
            self._collect_garbage()
            return Interruption.MEMORY
        except JSEvalException as error:
            raise InstanceError(f"the JavaScript runtime failed: {error}") from None

    def recover(self) -> dict[str, Any]:
        """What the runtime knows of the call V8 stopped (see the prelude's ``recover``)."""
        answer = self.call(f"{RUNTIME_GLOBAL}.recover()", 10.0)
        if isinstance(answer, Interruption):
            raise InstanceError(
                f"the JavaScript context of {self.filename} cannot recover after a "
                f"{answer.value} interruption; the instance restarts with a fresh one"
            )
        result: dict[str, Any] = json.loads(answer)
        return result

    def _collect_garbage(self) -> None:
        """After the heap limit stopped a call: free what the call left behind, and fail the
        instance if the script itself keeps (almost) the limit alive."""
        assert self._v8 is not None
        limit_mib = self.memory_limit_bytes // (1024 * 1024)
        try:
            self._v8.context.low_memory_notification()
            used = int(json.loads(self._v8.context.heap_stats())["used_heap_size"])
        except ValueError:  # an exhausted isolate answers nothing at all (not even JSON)
            raise InstanceError(
                f"out of memory: the JavaScript heap of {self.filename} is exhausted at its "
                f"limit of {limit_mib} MiB (resources.ram): the script keeps too much in global "
                "variables"
            ) from None
        if used > self.memory_limit_bytes * _HEAP_LEFT_AFTER_GC:
            raise InstanceError(
                f"out of memory: the JavaScript heap of {self.filename} holds "
                f"{used // (1024 * 1024)} MiB after garbage collection, near its limit of "
                f"{limit_mib} MiB (resources.ram): the script keeps too much in global variables"
            )

    def close(self) -> None:
        """Free the V8 context and the engine's loop (once; later calls do nothing)."""
        if self._v8 is None:
            return
        v8, self._v8 = self._v8, None
        # values are freed through their context: before it goes
        self._packed_run = self._no_arguments = None
        v8.close()


def syntax_error(filename: str, v8_message: str, source: str) -> str:
    """V8's parse error (``<anonymous>:LINE: SyntaxError: ...``, the line, a caret under the
    column) as ``syntax error in FILE, line L, column C: ...``."""
    lines = v8_message.split("\n")
    header = _PARSE_HEADER.match(lines[0])
    if header is None:
        return f"syntax error in {filename}: {v8_message.strip()}"
    line = int(header.group(1))
    source_line = lines[1] if len(lines) > 1 else ""
    caret = lines[2] if len(lines) > 2 else ""
    column = caret.find("^") + 1 if "^" in caret else 1
    source_lines = source.split("\n")
    if line > len(source_lines):  # at the sourceURL line we add: the end of the script
        line, source_line = len(source_lines), source_lines[-1]
        column = len(source_line) + 1
    return (
        f"syntax error in {filename}, line {line}, column {column}: "
        f"{header.group(2)}\n    {source_line.rstrip()}"
    )


def _thrown(v8_message: str) -> str:
    """The stack of an exception from mini-racer's message (which repeats the source line
    and a caret before it)."""
    parts = v8_message.strip().split("\n\n", 1)
    return parts[1].strip() if len(parts) == 2 and parts[1].strip() else parts[0]
