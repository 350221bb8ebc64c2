"""A submitted script is checked in a process of its own, as an instance user on a root
worker: its top level never runs in the worker, and a check says what is wrong as loading
the script in an instance would."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from magnetar.instance.exceptions import FunctionLoadError
from magnetar.worker.script_check import ScriptChecker
from tests.worker.conftest import isolation_in

UIDS = range(481000, 481002)


def check_processes() -> dict[int, int]:
    """pid -> real uid of the script check processes this test started, running now."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            status = dict(
                line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            )
        except OSError:
            continue
        checks = b"magnetar.instance.javascript.check_process" in command
        if checks and int(status["PPid"]) == os.getpid():
            found[int(pid)] = int(status["Uid"].split()[0])
    return found


def test_a_check_says_what_is_wrong_with_the_script() -> None:
    checker = ScriptChecker(None)
    with pytest.raises(FunctionLoadError, match=r"syntax error in f\.js, line 2, column \d+"):
        checker.check(b"function process(input) {\n  return input +;\n}\n", "f.js", None, 5000)
    with pytest.raises(FunctionLoadError, match=r"f\.js defines no function 'process'"):
        checker.check(b"function handle(input) { return input; }", "f.js", None, 5000)
    with pytest.raises(FunctionLoadError, match=r"f\.js is not UTF-8 text"):
        checker.check(b"\xff\xfe", "f.js", None, 5000)
    checker.check(b"function process(input) { return input; }", "f.js", None, 5000)


def test_checks_from_several_threads_at_once_all_answer() -> None:
    # V8 contexts on several threads of one process crash it; each check has a process
    checker = ScriptChecker(None)
    quick = b"function process(input) { return input; }"
    slow = b"var t = Date.now(); while (Date.now() - t < 200) {}\nfunction process(i) { return i; }"
    failures: list[BaseException] = []

    def check(source: bytes) -> None:
        try:
            checker.check(source, "f.js", None, 5000)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=check, args=(s,)) for s in (quick, slow, quick)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []
    assert not any(thread.is_alive() for thread in threads)


@pytest.mark.skipif(os.geteuid() != 0, reason="instance users need root (CI runs as root)")
def test_a_runaway_top_level_runs_as_an_instance_user_and_is_stopped(tmp_path: Path) -> None:
    isolation = isolation_in(tmp_path, UIDS, "instances")
    checker = ScriptChecker(isolation)
    outcome: list[BaseException] = []

    def check() -> None:
        try:
            checker.check(b"while (true) {}\nfunction process(i) { return i; }", "f.js", None, 1500)
        except BaseException as error:
            outcome.append(error)

    checking = threading.Thread(target=check)
    checking.start()
    seen: dict[int, int] = {}
    deadline = time.monotonic() + 10
    while checking.is_alive() and not seen and time.monotonic() < deadline:
        # it starts as root, and becomes the user before it reads the script
        seen = {pid: uid for pid, uid in check_processes().items() if uid != 0}
        time.sleep(0.05)
    checking.join(30)

    assert list(seen.values()) in ([UIDS[0]], [UIDS[1]])
    assert len(outcome) == 1 and isinstance(outcome[0], FunctionLoadError)
    assert "top-level code of f.js ran longer than 1500 ms" in str(outcome[0])
    assert check_processes() == {}
    assert list((tmp_path / "instances" / "script-checks").iterdir()) == []  # removed
