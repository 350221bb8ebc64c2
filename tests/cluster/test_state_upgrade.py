"""`magnetar worker upgrade-state`: state journaled under Magnetar 0.1.0's journal names is
found again by the upgraded workers."""

from __future__ import annotations

import os
import subprocess
import uuid

import httpx
import pulsar

from magnetar.statestore.journal import unescaped_journal_topic
from tests.cluster.conftest import Cluster
from tests.conftest import MAGNETAR
from tests.statestore.conftest import Journal, incr


def test_upgrade_state_carries_a_journal_over_from_0_1_0s_name(
    cluster: Cluster, cluster_client: pulsar.Client
) -> None:
    worker = cluster.start_worker("u0")
    for name in ("word-count", "plain"):
        made = cluster.create(worker, name, inputs=[f"in-{uuid.uuid4().hex[:6]}"])
        assert made.status_code == 204, made.text
    cluster.stop_all()
    system = f"public/{cluster.namespace}"
    # what a 0.1.0 instance journaled: its records under the unescaped name
    old = Journal(cluster_client, unescaped_journal_topic("public/default/word-count", system))
    old.send((0, [incr("seen", 3)]), (1, [incr("seen", 4)]))
    old.producer.close()

    upgrade = subprocess.run(
        [*MAGNETAR, "--broker-url", cluster.broker_url, "worker", "upgrade-state"],
        env={**os.environ, "MAGNETAR_SYSTEM_NAMESPACE": system},
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
    )
    assert upgrade.returncode == 0, upgrade.stderr
    assert "public/default/word-count: carried over 1 journal messages" in upgrade.stdout
    assert "2 functions checked, 1 carried over" in upgrade.stdout

    upgraded = cluster.start_worker("u1")
    state = httpx.get(
        f"{upgraded.url}/admin/v3/functions/public/default/word-count/state/seen", timeout=30
    )
    assert (state.status_code, state.json()["numberValue"]) == (200, 7)
