"""Checking a submitted JavaScript script, in a process of its own, as an instance user.

Loading a script runs its top level, which is its submitter's code. In the worker's process
it would run beside the worker's keys, its broker credentials and every tenant's secrets, with
only V8's sandbox between them. So the check runs in a child process
(``magnetar.instance.javascript.check_process``) that sees the environment instances see and,
on a worker that isolates instances (``isolation``), becomes an instance user of its own
before it reads the script. A child also keeps V8 out of the worker: V8, as mini-racer embeds
it, cannot hold contexts on several threads of one process, so in the worker checks had to
wait for each other; in children a few run side by side.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from magnetar.instance.exceptions import FunctionLoadError
from magnetar.instance.javascript import DEFAULT_MEMORY_LIMIT_BYTES
from magnetar.instance.privileges import InstanceUser, instance_environment
from magnetar.worker.isolation import SCRIPT_CHECKS, InstanceIsolation

__all__ = ["ScriptChecker"]

_AT_ONCE = 2
"""Checks running at once (a child holds an interpreter and a V8 isolate: ~60 MB)."""
_START_ALLOWANCE_S = 20.0
"""Added to the top level's time limit for the child's start; V8 itself stops the script."""
_STDERR_SHOWN = 2000


class ScriptChecker:
    """Checks scripts in child processes (see the module docstring)."""

    def __init__(self, isolation: InstanceIsolation | None) -> None:
        self._isolation = isolation
        self._slots = threading.BoundedSemaphore(_AT_ONCE)
        self._numbers = itertools.count(1)

    def check(
        self,
        source: bytes,
        filename: str,
        function_name: str | None,
        timeout_ms: int,
    ) -> None:
        """FunctionLoadError for a script that is not UTF-8, has a syntax error, throws or
        runs away in its top level, or lacks the function (as ``check_script`` says it), or
        whose check process dies."""
        try:
            text = source.decode("utf-8")
        except UnicodeDecodeError as error:
            raise FunctionLoadError(
                f"function script {filename} is not UTF-8 text: {error}"
            ) from None
        job: dict[str, object] = {
            "source": text,
            "filename": filename,
            "function_name": function_name,
            "timeout_ms": timeout_ms,
            "memory_limit_bytes": DEFAULT_MEMORY_LIMIT_BYTES,
        }
        with self._slots:
            if self._isolation is None:
                self._run(job, filename, timeout_ms)
                return
            self._run_isolated(self._isolation, job, filename, timeout_ms)

    def _run_isolated(
        self,
        isolation: InstanceIsolation,
        job: dict[str, object],
        filename: str,
        timeout_ms: int,
    ) -> None:
        with tempfile.TemporaryDirectory() as staging:
            package = Path(staging) / Path(filename).name
            package.write_text(str(job["source"]), encoding="utf-8")
            user = isolation.claim(SCRIPT_CHECKS, next(self._numbers), package)
        try:
            self._run({**job, "user": _user_json(user)}, filename, timeout_ms)
        finally:
            isolation.release(user.uid)  # kills what the check left running as the uid
            shutil.rmtree(user.work_dir, ignore_errors=True)

    @staticmethod
    def _run(job: dict[str, object], filename: str, timeout_ms: int) -> None:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "magnetar.instance.javascript.check_process"],
                input=json.dumps(job).encode(),
                capture_output=True,
                check=False,  # its answer is on stdout; a crash is read from stderr
                timeout=timeout_ms / 1000 + _START_ALLOWANCE_S,
                env=instance_environment(os.environ),
            )
        except subprocess.TimeoutExpired:
            raise FunctionLoadError(
                f"checking {filename} did not end within {timeout_ms} ms of its top level "
                f"and {_START_ALLOWANCE_S:.0f} s for the check to start"
            ) from None
        try:
            outcome = json.loads(done.stdout)
        except ValueError:
            stderr = done.stderr.decode(errors="replace").strip()[-_STDERR_SHOWN:]
            raise FunctionLoadError(
                f"loading {filename} ended the JavaScript engine's process (exit status "
                f"{done.returncode}): {stderr or 'no output'}"
            ) from None
        if outcome["error"] is not None:
            raise FunctionLoadError(outcome["error"])


def _user_json(user: InstanceUser) -> dict[str, object]:
    return {
        "uid": user.uid,
        "gid": user.gid,
        "work_dir": str(user.work_dir),
        "max_tasks": user.max_tasks,
        "private": user.private,
    }
