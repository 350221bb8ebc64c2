"""The process a worker checks a submitted script in (see ``magnetar.worker.script_check``).

It reads one job as JSON on stdin (the script, its file name, the function to find, the time
and heap limits, and the instance user to become, if any), becomes that user before it
touches the script, loads the script as ``check_script`` does and writes the outcome as JSON
on stdout: ``{"error": null}`` or ``{"error": "syntax error in f.js, line 2, ..."}``.

    python -m magnetar.instance.javascript.check_process < job.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from magnetar.instance.exceptions import FunctionLoadError
from magnetar.instance.javascript._check import check_script
from magnetar.instance.privileges import InstanceUser, drop_privileges

__all__ = ["main"]


def main() -> None:
    job: dict[str, Any] = json.load(sys.stdin)
    user = job.get("user")
    if user is not None:
        drop_privileges(
            InstanceUser(
                user["uid"], user["gid"], Path(user["work_dir"]), user["max_tasks"], user["private"]
            ),
            tmp_bytes=job["memory_limit_bytes"],
        )
    try:
        check_script(
            job["source"],
            job["filename"],
            job["function_name"],
            job["timeout_ms"],
            job["memory_limit_bytes"],
        )
    except FunctionLoadError as error:
        json.dump({"error": str(error)}, sys.stdout)
        return
    json.dump({"error": None}, sys.stdout)


if __name__ == "__main__":
    main()
