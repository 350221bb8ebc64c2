"""A V8 context through mini-racer, and how the caller waits for the answer of a task.

mini-racer runs each context's isolate on a thread of its own and answers every task through
one callback per context, on that thread. Its own callback is Python: for every answer, V8's
thread takes the GIL (and, not being a Python thread, a fresh thread state), and the caller
waits on a ``queue.Queue``. With the small library make builds (native/v8_answers), the
callback is C: it files the answer and posts a semaphore the caller waits on with the GIL
released. A call into V8 then takes about 50 us instead of 100 in a loop, and 85-120 us
instead of 190-200 on an idle core, which is most calls on a light stream.

A context opened that way has no mini-racer event loop, which only cancelable tasks, promises
and Python callbacks need: the engine uses none of them. Without the library (no C compiler
where make ran), or with its channels all taken, answers come through mini-racer's queue.
Both use mini-racer's private ``Context`` (pinned to 0.14 in pyproject.toml).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import itertools
import logging
import queue
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, cast

from py_mini_racer import MiniRacer, mini_racer
from py_mini_racer._context import _UNCANCELABLE_TASK_CALLBACK_ID, Context, ContextType
from py_mini_racer._dll import MR_CALLBACK, RawValueHandle, init_mini_racer
from py_mini_racer._objects import ObjectFactoryImpl
from py_mini_racer._value_handle import RawValueHandleType, ValueHandle

__all__ = ["V8Context", "open_v8_context"]

log = logging.getLogger(__name__)

_LIBRARY_PATH = Path(__file__).with_name("_v8_answers.so")


class V8Context(ABC):
    """mini-racer's context, and the callback id its tasks are answered under."""

    context: Context
    callback_id: int

    @abstractmethod
    def wait(self, timeout_s: float) -> ValueHandle | None:
        """The answer of the task in flight; None when none came within ``timeout_s``."""

    @abstractmethod
    def close(self) -> None:
        """Free the context (no answer comes after)."""


def open_v8_context() -> V8Context:
    """A context answered natively where the library is built, else through the queue."""
    library = _library()
    if library is not None:
        channel = int(library.mg_open())
        if channel >= 0:
            return _NativeAnswers(library, channel)
        log.debug("every native V8 answer channel is taken: answers come through a queue")
    return _QueuedAnswers()


class _NativeAnswers(V8Context):
    def __init__(self, library: ctypes.CDLL, channel: int) -> None:
        self._library = library
        self.callback_id = channel
        dll = init_mini_racer(ignore_duplicate_init=True)
        callback = ctypes.cast(library.mg_answer, MR_CALLBACK)
        self.context = Context(
            dll,
            ContextType(dll.mr_init_context(callback)),
            cast(Any, None),  # no event loop: no task of this context is cancelable
            ObjectFactoryImpl(),
            itertools.count(1),
        )

    def wait(self, timeout_s: float) -> ValueHandle | None:
        raw = self._library.mg_wait(self.callback_id, timeout_s)
        if not raw:
            return None
        return self.context._wrap_raw_handle(RawValueHandleType(ctypes.cast(raw, RawValueHandle)))

    def close(self) -> None:
        self.context._dll.mr_free_context(self.context._ctx)
        self._library.mg_close(self.callback_id)


class _QueuedAnswers(V8Context):
    """mini-racer's own context. Its asyncio loop runs only to open and close it (its thread
    loop would add two thread switches to every call); calls take mini-racer's synchronous
    path, answered through its queue."""

    callback_id = _UNCANCELABLE_TASK_CALLBACK_ID

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._maker = mini_racer(event_loop=self._loop)
        racer = self._loop.run_until_complete(self._enter())
        assert racer._ctx is not None
        self.context = racer._ctx

    async def _enter(self) -> MiniRacer:
        # entered on the loop, so mini-racer's own first eval runs on it too
        return self._maker.__enter__()

    def wait(self, timeout_s: float) -> ValueHandle | None:
        try:
            return self.context._non_cancelable_mr_task_results_queue.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._maker.__exit__(None, None, None)
        self._loop.close()


@functools.cache
def _library() -> ctypes.CDLL | None:
    if not _LIBRARY_PATH.exists():
        return None
    try:
        library = ctypes.CDLL(str(_LIBRARY_PATH))
    except OSError as error:
        log.warning("cannot load %s (answers come through a queue): %s", _LIBRARY_PATH, error)
        return None
    library.mg_open.restype = ctypes.c_int64
    library.mg_close.argtypes = [ctypes.c_uint64]
    library.mg_wait.argtypes = [ctypes.c_uint64, ctypes.c_double]
    library.mg_wait.restype = ctypes.c_void_p
    return library
