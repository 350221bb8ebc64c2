"""Loading the user's function from a .py file or a .zip, as Pulsar's Python runtime does."""

from __future__ import annotations

import hashlib
import re
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from magnetar.instance.exceptions import FunctionLoadError
from magnetar.instance.loader import code_search_paths, load_function
from magnetar.instance.timer_callbacks import PythonCallbacks
from tests.conftest import EXAMPLES


@pytest.fixture(autouse=True)
def _isolated_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Keep sys.path as it was and forget the modules imported from tmp_path."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def unique(prefix: str) -> str:
    """A module name no other test uses (imported modules stay in sys.modules)."""
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def write_module(directory: Path, source: str, prefix: str = "fn") -> Path:
    path = directory / f"{unique(prefix)}.py"
    path.write_text(source)
    return path


def load_error(py: Path | str, class_name: str | None = None, **kwargs: Any) -> str:
    with pytest.raises(FunctionLoadError) as caught:
        load_function(py, class_name, **kwargs)
    return str(caught.value)


class FakeContext:
    def __init__(self, user_config: dict[str, Any]) -> None:
        self.user_config = user_config

    def get_user_config_value(self, key: str) -> Any:
        return self.user_config.get(key)


# --- the examples --------------------------------------------------------------------------


def test_class_given_as_module_dot_class() -> None:
    loaded = load_function(EXAMPLES / "exclamation.py", "exclamation.ExclamationFunction")

    assert loaded.name == "ExclamationFunction"
    assert loaded.takes_context is True
    assert loaded.process("hello", None) == "hello!"
    assert EXAMPLES in loaded.search_paths


def test_class_given_without_its_module() -> None:
    loaded = load_function(EXAMPLES / "fragile.py", "FragileFunction")

    assert loaded.name == "FragileFunction"
    assert loaded.takes_context is True
    assert loaded.process("quiet", None) == "QUIET"
    with pytest.raises(ValueError, match="cannot handle 'boom'"):
        loaded.process("boom", None)


def test_plain_process_function() -> None:
    loaded = load_function(EXAMPLES / "native_exclamation.py", "native_exclamation.process")

    assert loaded.name == "process"
    assert loaded.takes_context is False
    assert loaded.process("hello") == "hello!"


@pytest.mark.parametrize(
    ("example", "name", "takes_context"),
    [
        ("exclamation.py", "ExclamationFunction", True),
        ("fragile.py", "FragileFunction", True),
        ("json_serde.py", "DoubleAmountFunction", True),
        ("logging_function.py", "LoggingFunction", True),
        ("native_exclamation.py", "process", False),
        ("publish.py", "PublishFunction", True),
        ("reminders.py", "Reminders", True),
        ("slow.py", "process", False),
        ("user_config.py", "GreetingFunction", True),
        ("async_lookup.py", "AsyncLookup", True),
        ("window_average.py", "process", True),
        ("window_count.py", "process", False),
        ("word_count.py", "WordCountFunction", True),
        ("word_split.py", "WordSplitFunction", True),
    ],
)
def test_default_entry_point_of_each_example(example: str, name: str, takes_context: bool) -> None:
    loaded = load_function(EXAMPLES / example, None)

    assert loaded.name == name
    assert loaded.takes_context is takes_context
    assert callable(loaded.process)


def test_every_example_is_covered() -> None:
    examples = {p.name for p in EXAMPLES.glob("*.py")}
    assert examples == {
        "async_lookup.py",
        "exclamation.py",
        "fragile.py",
        "json_serde.py",
        "logging_function.py",
        "native_exclamation.py",
        "publish.py",
        "reminders.py",
        "slow.py",
        "user_config.py",
        "window_average.py",
        "window_count.py",
        "word_count.py",
        "word_split.py",
    }


def test_examples_give_the_expected_results() -> None:
    double = load_function(EXAMPLES / "json_serde.py", "json_serde.DoubleAmountFunction")
    assert double.process({"id": 7, "amount": 21}, None) == {"id": 7, "amount": 42}

    greet = load_function(EXAMPLES / "user_config.py", "user_config.GreetingFunction")
    assert greet.process("Ada", FakeContext({})) == "Hello, Ada"
    assert greet.process("Ada", FakeContext({"greeting": "Hi", "times": "2"})) == (
        "Hi, Ada Hi, Ada"
    )

    slow = load_function(EXAMPLES / "slow.py", None)
    assert slow.process("fast") == "fast"


def test_each_load_creates_a_new_instance() -> None:
    first = load_function(EXAMPLES / "exclamation.py", "exclamation.ExclamationFunction")
    second = load_function(EXAMPLES / "exclamation.py", "exclamation.ExclamationFunction")
    assert first.process.__self__ is not second.process.__self__  # type: ignore[attr-defined]


# --- forms of user code --------------------------------------------------------------------


def test_process_function_with_context(tmp_path: Path) -> None:
    path = write_module(tmp_path, "def process(input, context):\n    return (input, context)\n")

    loaded = load_function(path, None)

    assert loaded.name == "process"
    assert loaded.takes_context is True
    assert loaded.process("x", "ctx") == ("x", "ctx")
    assert loaded.search_paths == [tmp_path.resolve()]


def test_class_without_pulsar_base_class(tmp_path: Path) -> None:
    path = write_module(
        tmp_path,
        "class Upper:\n    def process(self, input, context):\n        return input.upper()\n",
    )

    loaded = load_function(path, f"{path.stem}.Upper")

    assert loaded.takes_context is True
    assert loaded.process("abc", None) == "ABC"


def test_class_whose_process_takes_only_the_input(tmp_path: Path) -> None:
    path = write_module(
        tmp_path, "class Twice:\n    def process(self, input):\n        return input * 2\n"
    )

    loaded = load_function(path, "Twice")

    assert loaded.takes_context is False
    assert loaded.process("ab") == "abab"


def test_module_with_two_function_classes_needs_a_classname(tmp_path: Path) -> None:
    path = write_module(
        tmp_path,
        "from pulsar import Function\n"
        "class A(Function):\n    def process(self, input, context):\n        return 'a'\n"
        "class B(Function):\n    def process(self, input, context):\n        return 'b'\n",
    )

    message = load_error(path)
    assert f"cannot tell which function to run in module {path.stem!r}" in message
    assert "--classname" in message

    assert load_function(path, "B").process("x", None) == "b"


# --- errors --------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.py"
    assert load_error(path, "missing.Fn") == f"function file {path} does not exist"


def test_wrong_suffix(tmp_path: Path) -> None:
    path = tmp_path / "function.txt"
    path.write_text("def process(input):\n    return input\n")
    assert load_error(path) == f"function file {path} must be a .py file, a .zip or a .whl wheel"


def test_syntax_error_names_file_line_and_column(tmp_path: Path) -> None:
    path = write_module(
        tmp_path, "def process(input):\n    return input +\n", prefix="syntax_error"
    )

    message = load_error(path)

    assert message.startswith(f"syntax error in {path.resolve()}, line 2, column ")
    assert re.search(r"line 2, column \d+: invalid syntax", message)
    assert "return input +" in message


def test_failing_import_names_the_missing_module(tmp_path: Path) -> None:
    path = write_module(
        tmp_path,
        "import not_a_real_module_xyz\n\ndef process(input):\n    return input\n",
        prefix="needs_dep",
    )

    message = load_error(path)

    assert f"importing {path.stem!r} failed" in message
    assert "not_a_real_module_xyz" in message
    assert "is the dependency installed" in message


def test_module_raising_at_import(tmp_path: Path) -> None:
    path = write_module(tmp_path, "raise RuntimeError('no config here')\n", prefix="raises")

    message = load_error(path, f"{path.stem}.Fn")

    assert message == f"importing {path.stem!r} failed: RuntimeError: no config here"


def test_unknown_module_in_classname(tmp_path: Path) -> None:
    path = write_module(tmp_path, "def process(input):\n    return input\n")

    message = load_error(path, "no_such_module_abc.Fn")

    assert f"no module named 'no_such_module_abc' in {tmp_path.resolve()}" in message


def test_unknown_class_lists_what_the_module_defines() -> None:
    message = load_error(EXAMPLES / "exclamation.py", "exclamation.ExclamatonFunction")

    assert message == (
        "module 'exclamation' has no class or function 'ExclamatonFunction'; "
        "it defines: ExclamationFunction"
    )


def test_unknown_class_without_module_lists_what_the_module_defines(tmp_path: Path) -> None:
    path = write_module(
        tmp_path,
        "import os\nfrom pulsar import Function\n\n"
        "class Beta(Function):\n    def process(self, input, context):\n        return input\n\n"
        "def alpha(input):\n    return input\n\n"
        "def _private(input):\n    return input\n",
    )

    message = load_error(path, "Gamma")

    assert message == (
        f"no module named 'Gamma' next to {path.name}, and module {path.stem!r} has no class "
        "or function 'Gamma'; it defines: Beta, alpha"
    )


def test_class_without_process(tmp_path: Path) -> None:
    path = write_module(tmp_path, "class NoProcess:\n    def run(self, input):\n        pass\n")

    message = load_error(path, f"{path.stem}.NoProcess")

    assert message == "class 'NoProcess' has no process(self, input, context) method"


def test_class_whose_constructor_fails(tmp_path: Path) -> None:
    path = write_module(
        tmp_path,
        "class Needy:\n"
        "    def __init__(self, setting):\n        self.setting = setting\n"
        "    def process(self, input, context):\n        return input\n",
    )

    message = load_error(path, "Needy")

    assert message.startswith("creating an instance of 'Needy' failed: TypeError: ")
    assert "setting" in message


def test_name_that_is_not_callable(tmp_path: Path) -> None:
    path = write_module(tmp_path, "VERSION = '1.0'\n")
    assert load_error(path, "VERSION") == "'VERSION' is neither a class, a module nor a function"


def test_process_that_takes_no_input(tmp_path: Path) -> None:
    path = write_module(tmp_path, "def process():\n    return 1\n")
    message = load_error(path)
    assert message == (
        "the process of 'process' takes no input: write process(input) or "
        "process(self, input, context)"
    )


def test_module_with_nothing_to_run(tmp_path: Path) -> None:
    path = write_module(tmp_path, "X = 1\n")
    assert "cannot tell which function to run" in load_error(path)


# --- Apache Pulsar's class name forms ---------------------------------------------------


def test_a_name_without_a_dot_is_the_module_whose_process_runs(tmp_path: Path) -> None:
    # Apache's native_exclamation_function / pure_python_function_exclamation convention
    path = write_module(tmp_path, "def process(input):\n    return input + '!'\n")

    loaded = load_function(path, path.stem)

    assert loaded.process("hi") == "hi!"
    assert not loaded.takes_context


def test_the_module_form_wins_over_a_class_of_the_same_module(tmp_path: Path) -> None:
    path = write_module(
        tmp_path,
        "from pulsar import Function\n\n"
        "class Loud(Function):\n    def process(self, input, context):\n        return 'class'\n\n"
        "def process(input):\n    return 'module'\n",
    )

    assert load_function(path, path.stem).process("x") == "module"


def test_a_module_without_process(tmp_path: Path) -> None:
    path = write_module(tmp_path, "def handle(input):\n    return input\n")

    assert load_error(path, path.stem) == (
        f"module {path.stem!r} has no process function: define def process(input) in it, "
        "or name a class with --classname module.ClassName"
    )


def test_package_module_class_and_package_module(tmp_path: Path) -> None:
    package = unique("pkg")
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "handlers.py").write_text(
        "from pulsar import Function\n\n"
        "class Upper(Function):\n    def process(self, input, context):\n"
        "        return input.upper()\n\n"
        "def process(input):\n    return input[::-1]\n"
    )
    entry = tmp_path / "main.py"
    entry.write_text("")

    assert load_function(entry, f"{package}.handlers.Upper").process("ab", None) == "AB"
    assert load_function(entry, f"{package}.handlers").process("ab") == "ba"


def test_a_process_with_too_many_parameters(tmp_path: Path) -> None:
    path = write_module(
        tmp_path,
        "class Greedy:\n    def process(self, input, context, extra):\n        return input\n",
    )

    assert load_error(path, f"{path.stem}.Greedy") == (
        "the process of 'Greedy' has too many parameters: it is called as process(input) or "
        "process(input, context), so extra would have no value"
    )


# --- zip packages --------------------------------------------------------------------------


def make_zip(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


HELPER = "def shout(text):\n    return text.upper() + '!'\n"


def function_module(helper: str) -> str:
    return (
        "from pulsar import Function\n"
        f"from {helper} import shout\n\n"
        "class Shout(Function):\n"
        "    def process(self, input, context):\n"
        "        return shout(input)\n"
    )


def unpacked(work: Path, package: Path) -> Path:
    """Where a zip's code is unpacked: under the work dir, by name and digest."""
    digest = hashlib.sha256(package.read_bytes()).hexdigest()[:16]
    return work / f"{package.stem}-{digest}" / "code"


def test_zip_with_the_module_at_its_root(tmp_path: Path) -> None:
    module, helper = unique("zipped"), unique("helper")
    package = make_zip(
        tmp_path / f"{module}.zip",
        {f"{module}.py": function_module(helper), f"{helper}.py": HELPER},
    )

    loaded = load_function(package, f"{module}.Shout", work_dir=tmp_path / "work")

    assert loaded.name == "Shout"
    assert loaded.takes_context is True
    assert loaded.process("hi", None) == "HI!"
    assert loaded.search_paths == [unpacked(tmp_path / "work", package)]


def test_zip_default_entry_point_is_the_module_named_after_the_zip(tmp_path: Path) -> None:
    module = unique("plain_zip")
    package = make_zip(
        tmp_path / f"{module}.zip", {f"{module}.py": "def process(input):\n    return -input\n"}
    )

    loaded = load_function(package, None, work_dir=tmp_path / "work")

    assert loaded.name == "process"
    assert loaded.takes_context is False
    assert loaded.process(5) == -5


def test_zip_with_a_single_top_level_folder_and_src(tmp_path: Path) -> None:
    module, helper = unique("nested"), unique("nested_helper")
    package = make_zip(
        tmp_path / "package.zip",
        {
            f"my-function/src/{module}.py": function_module(helper),
            f"my-function/src/{helper}.py": HELPER,
            "my-function/README.md": "docs\n",
        },
    )

    loaded = load_function(package, f"{module}.Shout", work_dir=tmp_path / "work")

    assert loaded.process("ok", None) == "OK!"
    root = unpacked(tmp_path / "work", package)
    assert loaded.search_paths == [root, root / "my-function", root / "my-function" / "src"]


def test_zip_deps_folder_is_searched(tmp_path: Path) -> None:
    module, helper = unique("with_deps"), unique("dep")
    package = make_zip(
        tmp_path / "bundle.zip",
        {f"{module}.py": function_module(helper), f"deps/{helper}.py": HELPER},
    )

    loaded = load_function(package, f"{module}.Shout", work_dir=tmp_path / "work")

    assert loaded.process("dep", None) == "DEP!"


def test_zip_extracted_next_to_it_without_a_work_dir(tmp_path: Path) -> None:
    module = unique("beside")
    package = make_zip(tmp_path / "beside.zip", {f"{module}.py": "def process(x):\n    return x\n"})

    paths = code_search_paths(package)

    assert paths == [unpacked(tmp_path.resolve() / ".magnetar-code", package)]
    assert (paths[0] / f"{module}.py").is_file()


def test_corrupt_zip(tmp_path: Path) -> None:
    package = tmp_path / "corrupt.zip"
    package.write_bytes(b"this is not a zip archive")

    message = load_error(package, "corrupt.Fn", work_dir=tmp_path / "work")

    assert message.startswith(f"cannot extract function package {package.resolve()}: ")
    assert "not a zip file" in message


def test_zip_without_the_named_module(tmp_path: Path) -> None:
    package = make_zip(tmp_path / "empty.zip", {"README.md": "nothing here\n"})
    module = unique("absent")

    message = load_error(package, f"{module}.Fn", work_dir=tmp_path / "work")

    assert message.startswith(f"no module named {module!r} in ")


# --- several functions in one process -----------------------------------------------------


def test_functions_whose_files_share_a_name_each_run_their_own_code(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As on the thread runtime: the second ``shout.py`` (and the ``helper`` it imports) is
    its own, and the function loaded first goes on running its code."""
    module = unique("shout")
    for team in ("a", "b"):
        (tmp_path / team).mkdir()
        (tmp_path / team / "helper.py").write_text(f"PREFIX = {team.upper()!r}\n")
        (tmp_path / team / f"{module}.py").write_text(
            "import helper\n\ndef process(x):\n    return helper.PREFIX + ':' + x\n"
        )

    first = load_function(tmp_path / "a" / f"{module}.py", None)
    with caplog.at_level("INFO", logger="magnetar.instance.code_modules"):
        second = load_function(tmp_path / "b" / f"{module}.py", None)

    assert (first.process("x"), second.process("y")) == ("A:x", "B:y")
    assert f"module {module!r}: importing {tmp_path / 'b' / module}.py in place of " in caplog.text


def test_a_function_file_changed_in_place_is_loaded_anew(tmp_path: Path) -> None:
    path = write_module(tmp_path, "def process(x):\n    return 'old ' + x\n")
    assert load_function(path, None).process("x") == "old x"

    path.write_text("def process(x):\n    return 'the new ' + x\n")

    assert load_function(path, None).process("x") == "the new x"


def test_a_package_with_compiled_modules_is_not_imported_twice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An extension module cannot be loaded twice in a process: the function loaded later
    shares the first one's package, and the log says so."""
    package = unique("fastlib")
    for team in ("a", "b"):
        (tmp_path / team / package).mkdir(parents=True)
        (tmp_path / team / package / "__init__.py").write_text(f"TEAM = {team!r}\n")
        (tmp_path / team / "fn.py").write_text(
            f"import {package}\n\ndef process(x):\n    return {package}.TEAM\n"
        )
    first = load_function(tmp_path / "a" / "fn.py", None)
    # as if the package had imported a compiled module of its own
    speedups = type(sys)(f"{package}._speedups")
    speedups.__file__ = str(tmp_path / "a" / package / "_speedups.cpython-311-x86_64-linux-gnu.so")
    sys.modules[speedups.__name__] = speedups
    try:
        with caplog.at_level("WARNING", logger="magnetar.instance.code_modules"):
            second = load_function(tmp_path / "b" / "fn.py", None)
    finally:
        del sys.modules[speedups.__name__]

    assert (first.process("x"), second.process("x")) == ("a", "a")
    assert f"compiled module {package}._speedups cannot be loaded twice" in caplog.text


def test_a_module_of_a_package_changed_in_place_is_loaded_anew(tmp_path: Path) -> None:
    package = unique("shapes")
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "square.py").write_text("def process(x):\n    return 'old'\n")
    (tmp_path / "fn.py").write_text("")  # the --py file beside the package
    assert load_function(tmp_path / "fn.py", f"{package}.square.process").process("x") == "old"

    (tmp_path / package / "square.py").write_text("def process(x):\n    return 'the new'\n")

    assert load_function(tmp_path / "fn.py", f"{package}.square.process").process("x") == "the new"


def test_a_timer_callback_named_by_module_is_found_in_the_functions_own_module(
    tmp_path: Path,
) -> None:
    """A timer stores its callback as ``module:function`` and finds it again when it fires,
    after another function with a module of that name may have been loaded."""
    module = unique("shout")
    for team in ("a", "b"):
        (tmp_path / team).mkdir()
        (tmp_path / team / f"{module}.py").write_text(
            f"def process(x, context):\n    return x\n\n"
            f"def on_timer(payload, context):\n    return {team!r}\n"
        )
    first = load_function(tmp_path / "a" / f"{module}.py", f"{module}.process")
    callbacks = PythonCallbacks(first)
    name = callbacks.name(first.modules[module].on_timer)

    second = load_function(tmp_path / "b" / f"{module}.py", f"{module}.process")

    assert name == f"{module}:on_timer"
    assert callbacks.find(name)(None, None) == "a"
    assert PythonCallbacks(second).find(name)(None, None) == "b"
