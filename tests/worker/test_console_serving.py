"""The web console's page and assets as a worker serves them, the setting that turns them off,
and the term the console reads from the worker's stats (what a browser does with them:
tests/cluster/test_console.py)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.worker.conftest import InProcessCluster


def test_a_worker_serves_the_console_unless_its_setting_turns_it_off(
    broker_url: str, tmp_path: Path
) -> None:
    served = InProcessCluster(broker_url, tmp_path / "on", size=1)
    try:
        url = served.workers[0].config.admin_url
        assert httpx.get(f"{url}/console").headers["location"] == "/console/"
        page = httpx.get(f"{url}/console/")
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert '<script type="module" src="console.js">' in page.text
        for asset, kind in (("console.js", "text/javascript"), ("console.css", "text/css")):
            answer = httpx.get(f"{url}/console/{asset}")
            assert (answer.status_code, answer.headers["content-type"].split(";")[0]) == (
                200,
                kind,
            )
        stats = httpx.get(f"{url}/admin/v2/worker-stats/metrics").json()[0]["metrics"]
        assert stats["cluster.term"] >= 1 and stats["cluster.assignmentVersion"] >= 1
        missing = httpx.get(f"{url}/console/secrets.txt")
        assert (missing.status_code, missing.json()) == (
            404,
            {"reason": "the console has no file 'secrets.txt'"},
        )
    finally:
        served.stop()

    off = InProcessCluster(broker_url, tmp_path / "off", size=1, console_enabled=False)
    try:
        url = off.workers[0].config.admin_url
        assert httpx.get(f"{url}/console/").status_code == 404
        assert httpx.get(f"{url}/admin/v2/worker/cluster").status_code == 200
    finally:
        off.stop()
