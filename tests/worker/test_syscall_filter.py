"""The system calls an isolated instance may not make (``magnetar.instance.syscall_filter``):
the kernel's keyrings, which one tenant's function used to hand the next function given its
uid, user namespaces and io_uring; what a function needs (threads, processes) still works."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from pathlib import Path

import pulsar
import pytest

from magnetar.instance.syscall_filter import filter_unavailable, refuse_syscalls
from magnetar.worker.runtime import ProcessRuntime
from tests.integration.conftest import collect, produce, values
from tests.worker.conftest import (
    WORKER_ID,
    StartManager,
    function_config,
    instance_specs,
    isolation_in,
)

needs_filter = pytest.mark.skipif(
    filter_unavailable() is not None, reason=str(filter_unavailable())
)

KEYCTL, UNSHARE, IO_URING_SETUP = 250, 272, 425  # x86-64's numbers
CLONE_NEWUSER = 0x10000000


def _call(number: int, *arguments: int) -> str:
    libc = ctypes.CDLL(None, use_errno=True)
    done = libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in arguments))
    return "ok" if done >= 0 else os.strerror(ctypes.get_errno())


@needs_filter
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the test calls by x86-64's numbers")
def test_refused_calls_fail_with_eperm_and_threads_and_processes_still_start() -> None:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child reports in lines, then exits
        said = []
        try:
            threading.Thread(target=lambda: None).start()  # one before: the filter takes it too
            ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS, as instances have
            refuse_syscalls()
            said.append(f"keyctl: {_call(KEYCTL, 22, -1, -2)}")  # the persistent keyring
            said.append(f"user namespace: {_call(UNSHARE, CLONE_NEWUSER)}")
            said.append(f"io_uring: {_call(IO_URING_SETUP, 1, 0)}")
            thread = threading.Thread(target=lambda: said.append("thread: ok"))
            thread.start()
            thread.join()
            run = subprocess.run(
                [sys.executable, "-c", "print('ok')"], check=True, capture_output=True
            )
            said.append(f"process: {run.stdout.decode().strip()}")
        except Exception as error:
            said.append(repr(error))
        finally:
            os.write(write, "\n".join(said).encode())
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as report:
        said = report.read().splitlines()
    os.waitpid(child, 0)
    assert said == [
        "keyctl: Operation not permitted",
        "user namespace: Operation not permitted",
        "io_uring: Operation not permitted",
        "thread: ok",
        "process: ok",
    ]


# Stores its input in the persistent keyring of its uid, or reads what is there.
KEYRING = """
import ctypes, os

libc = ctypes.CDLL(None, use_errno=True)


def keyctl(*arguments):
    done = libc.syscall(250, *(ctypes.c_long(a) if isinstance(a, int) else a for a in arguments))
    if done < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return done


def process(input):
    try:
        ring = keyctl(22, -1, -2)  # KEYCTL_GET_PERSISTENT of its own uid
        if input != "read":
            secret = input.encode()
            libc.syscall(248, b"user", b"left", secret, ctypes.c_size_t(len(secret)), ring)
            return "stored"
        key = keyctl(10, ring, b"user", b"left", 0)  # KEYCTL_SEARCH
        found = ctypes.create_string_buffer(100)
        length = keyctl(11, key, found, 100)  # KEYCTL_READ
        return found.raw[:length].decode()
    except OSError as error:
        return error.strerror
"""


@needs_filter
@pytest.mark.skipif(os.geteuid() != 0, reason="isolated instances need a root worker")
def test_a_function_finds_nothing_of_the_last_tenant_given_its_uid_in_the_keyrings(
    tmp_path: Path,
    broker_url: str,
    client: pulsar.Client,
    start_manager: StartManager,
    topic: str,
) -> None:
    code = tmp_path / "keyring.py"
    code.write_text(KEYRING)
    # one uid: the second tenant's instance is given the uid the first one had
    runtime = ProcessRuntime(
        broker_url, WORKER_ID, isolation=isolation_in(tmp_path, range(480060, 480061))
    )
    manager = start_manager(runtime)
    answers = []
    for tenant, asked in (("first", "the first tenant's secret"), ("second", "read")):
        source = f"{topic}-{tenant}"
        config = function_config(
            py=str(code), tenant=tenant, inputs=[source], output=f"{source}-out"
        )
        manager.apply(instance_specs(config))
        produce(client, source, [asked])
        answers += values(collect(client, f"{source}-out", 1))
        manager.apply({})  # its uid released, for the next
    assert answers == ["Operation not permitted", "Operation not permitted"]
