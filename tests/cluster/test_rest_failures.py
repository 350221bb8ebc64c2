"""REST answers while a worker dies: 503 naming the dead owner, never a 500."""

from __future__ import annotations

import uuid

import httpx

from tests.cluster.conftest import Cluster, wait_until

FUNCTIONS = "/admin/v3/functions/public/default"


def test_an_instance_on_a_dead_worker_is_503_until_it_runs_elsewhere(cluster: Cluster) -> None:
    workers = cluster.start(3)
    created = cluster.create(
        workers[0], "fragile", inputs=[f"in-{uuid.uuid4().hex[:6]}"], parallelism=3
    )
    assert created.status_code == 204, created.text
    wait_until(lambda: cluster.status(workers[0], "fragile")["numRunning"] == 3, 20, "running")
    leader = cluster.leader_id()
    victim = next(w for w in workers if w.worker_id != leader)
    survivor = next(w for w in workers if w.worker_id == leader)
    owned = [int(key.rsplit(":", 1)[1]) for key in cluster.assignments(survivor)[victim.worker_id]]
    victim.kill()

    restart = httpx.post(f"{survivor.url}{FUNCTIONS}/fragile/{owned[0]}/restart", timeout=30)
    assert restart.status_code == 503, restart.text
    assert restart.json()["reason"].startswith(f"worker {victim.worker_id} at http://")
    status = httpx.get(f"{survivor.url}{FUNCTIONS}/fragile/{owned[0]}/status", timeout=30)
    assert status.status_code == 200
    assert status.json()["running"] is False
    assert victim.worker_id in status.json()["error"]

    wait_until(lambda: cluster.status(survivor, "fragile")["numRunning"] == 3, 15, "rescheduled")
    moved = httpx.get(f"{survivor.url}{FUNCTIONS}/fragile/{owned[0]}/status", timeout=30).json()
    assert moved["running"] is True and moved["workerId"] != victim.worker_id
    again = httpx.post(f"{survivor.url}{FUNCTIONS}/fragile/{owned[0]}/restart", timeout=30)
    assert again.status_code == 204, again.text
