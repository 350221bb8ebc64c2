"""Function packages that carry their dependencies: a zip with requirements.txt and wheels, a
wheel; installed once per package digest, offline when the wheels are in the package."""

from __future__ import annotations

import sys
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from magnetar.instance.exceptions import FunctionLoadError
from magnetar.instance.loader import load_function
from tests.wheels import make_wheel


@pytest.fixture(autouse=True)
def _isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """An index that cannot be reached: an install must come from the package's wheels."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:1/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "1")


def shouting_zip(tmp_path: Path, dependency: str, requirements: str) -> Path:
    wheel = make_wheel(tmp_path, dependency, {f"{dependency}/__init__.py": "LOUD = '!!'\n"})
    package = tmp_path / "shout.zip"
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr(
            "shout/src/shout.py",
            f"from {dependency} import LOUD\n\n\ndef process(input):\n    return input + LOUD\n",
        )
        archive.writestr("shout/requirements.txt", requirements)
        archive.write(wheel, f"shout/deps/{wheel.name}")
    return package


def test_a_zip_installs_its_requirements_from_its_own_wheels_offline(
    tmp_path: Path, offline: None
) -> None:
    dependency = f"loudness_{uuid.uuid4().hex[:6]}"
    package = shouting_zip(tmp_path, dependency, f"{dependency}==1.0\n")

    loaded = load_function(package, "shout", work_dir=tmp_path / "work")

    assert loaded.process("hey") == "hey!!"


def test_a_second_start_finds_the_installed_environment(tmp_path: Path, offline: None) -> None:
    dependency = f"loudness_{uuid.uuid4().hex[:6]}"
    package = shouting_zip(tmp_path, dependency, f"{dependency}\n")
    load_function(package, "shout", work_dir=tmp_path / "work")
    del sys.modules["shout"], sys.modules[dependency]

    started = time.perf_counter()
    loaded = load_function(package, "shout", work_dir=tmp_path / "work")

    assert loaded.process("again") == "again!!"
    assert time.perf_counter() - started < 0.5  # no pip this time


def test_a_wheel_package_with_its_dependency(tmp_path: Path, offline: None) -> None:
    dependency = f"loudness_{uuid.uuid4().hex[:6]}"
    make_wheel(tmp_path, dependency, {f"{dependency}/__init__.py": "LOUD = '?'\n"})
    package = make_wheel(
        tmp_path,
        f"asker_{uuid.uuid4().hex[:6]}",
        {
            "asker.py": (
                f"from {dependency} import LOUD\n\n\ndef process(input):\n    return input + LOUD\n"
            )
        },
        requires=(dependency,),
    )

    loaded = load_function(package, "asker", work_dir=tmp_path / "work")

    assert loaded.process("who") == "who?"


def test_a_failed_install_says_what_pip_said(tmp_path: Path, offline: None) -> None:
    package = shouting_zip(tmp_path, f"loudness_{uuid.uuid4().hex[:6]}", "no-such-dist-xyz\n")

    with pytest.raises(FunctionLoadError) as caught:
        load_function(package, "shout", work_dir=tmp_path / "work")

    message = str(caught.value)
    assert message.startswith("installing the dependencies of shout.zip failed:")
    assert "no-such-dist-xyz" in message
