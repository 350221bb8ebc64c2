"""Every convention of Apache Pulsar's Python examples through `magnetar functions localrun`,
unchanged, with the output Apache gives; then Ctrl-C ends every run cleanly."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

import pulsar

from tests.conventions import CONVENTIONS, check_all
from tests.integration.conftest import produce
from tests.integration.test_localrun_cli import LocalRunProcess


def test_every_apache_convention_runs_unchanged_in_localrun(
    client: pulsar.Client, cli_env: dict[str, str], tmp_path: Path
) -> None:
    prefix = f"lr{uuid.uuid4().hex[:6]}"
    runs: dict[str, LocalRunProcess] = {}
    try:
        for convention in CONVENTIONS:
            config = tmp_path / f"{convention.name}.json"
            config.write_text(json.dumps(convention.function_config(prefix)))
            runs[convention.name] = LocalRunProcess(
                [
                    "--py",
                    str(convention.package(tmp_path)),
                    "--name",
                    convention.name,
                    "--function-config-file",
                    str(config),
                    "--state-dir",
                    str(tmp_path / "state"),
                ],
                cli_env,
                [],
            )
            produce(client, convention.topics(prefix)["in"], convention.inputs)
        assert check_all(client, prefix, timeout_s=90) == {}
    finally:
        for run in runs.values():  # all at once: each drains its instance before it exits
            run.process.send_signal(signal.SIGINT)
        exits = {name: run.exit() for name, run in runs.items()}
    for name, (code, _) in exits.items():
        assert code == 0, f"{name}: exit {code}\n{runs[name].stderr}"
        # the failing function's traceback is logged once, not once per attempt
        assert runs[name].stderr.count("Traceback") == (name == "raises"), runs[name].stderr
