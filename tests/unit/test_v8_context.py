"""Calls into V8 are answered natively (the C library make builds) or, without it, through
mini-racer's Python callback: both give the same results, time limits and heap limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from magnetar.instance.javascript import _v8_context
from tests.unit.test_javascript import executor, outputs

_SCRIPT = """
function process(input) {
  if (input === 'loop') { while (true) {} }
  if (input === 'hog') {
    const hoard = [];
    while (true) hoard.push(new Array(100000).fill(input));
  }
  return input + '!';
}
"""


@pytest.fixture(params=["native", "queued"])
def answers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "queued":
        monkeypatch.setattr(_v8_context, "_library", lambda: None)
    elif _v8_context._library() is None:
        pytest.skip(f"make built no {_v8_context._LIBRARY_PATH.name} here (no C compiler)")
    return str(request.param)


def test_the_engine_is_answered_the_chosen_way(answers: str) -> None:
    context = _v8_context.open_v8_context()
    try:
        native = isinstance(context, _v8_context._NativeAnswers)
        assert native == (answers == "native")
    finally:
        context.close()


def test_results_time_limits_and_the_heap_limit_hold_either_way(
    tmp_path: Path, answers: str
) -> None:
    run = executor(tmp_path, _SCRIPT, timeout_ms=300, resources={"ram": 64 * 1024 * 1024})
    try:
        assert outputs(run, ["a", "loop", "b", "hog", "c"]) == [
            "a!",
            "the function ran longer than its timeout of 300 ms",
            "b!",
            "the function exceeded the JavaScript heap limit of 64 MiB",
            "c!",
        ]
    finally:
        run.close()


def test_a_process_whose_native_channels_are_all_taken_is_answered_through_python() -> None:
    library = _v8_context._library()
    if library is None:
        pytest.skip(f"make built no {_v8_context._LIBRARY_PATH.name} here (no C compiler)")
    taken = []
    try:
        while (channel := library.mg_open()) >= 0:
            taken.append(channel)
        context = _v8_context.open_v8_context()
        try:
            assert isinstance(context, _v8_context._QueuedAnswers)
        finally:
            context.close()
    finally:
        for channel in taken:
            library.mg_close(channel)
    context = _v8_context.open_v8_context()  # a channel let go is taken again
    try:
        assert isinstance(context, _v8_context._NativeAnswers)
    finally:
        context.close()


def test_a_time_limit_beyond_what_timers_can_wait_is_no_limit(tmp_path: Path, answers: str) -> None:
    run = executor(tmp_path, _SCRIPT, timeout_ms=10**23)
    try:
        assert outputs(run, ["a", "b"]) == ["a!", "b!"]
    finally:
        run.close()
