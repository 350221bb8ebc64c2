"""A function created from a package of Pulsar's package management (``function://``), on
pulsar-lite and on Apache Pulsar: uploaded through one worker, created through another,
run wherever it is scheduled."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from tests.cluster.conftest import Cluster, wait_until
from tests.conftest import EXAMPLES

CODE = (EXAMPLES / "exclamation.py").read_bytes()


@pytest.mark.brokers("lite", "apache")
def test_a_function_runs_from_a_function_package(cluster: Cluster) -> None:
    first, second = cluster.start_worker("w1"), cluster.start_worker("w2")
    name = f"pkgfn{uuid.uuid4().hex[:6]}"
    url = f"function://public/default/{name}@1.0"
    uploaded = httpx.post(
        f"{first.url}/admin/v3/packages/function/public/default/{name}/1.0",
        files={"file": ("exclamation.py", CODE)},
        data={"metadata": json.dumps({"description": "shouts"})},
        timeout=30,
    )
    assert uploaded.status_code == 204, uploaded.text
    config = {
        "className": "exclamation.ExclamationFunction",
        "inputs": [f"{name}-in"],
        "output": f"{name}-out",
    }
    functions = f"{second.url}/admin/v3/functions/public/default/{name}"
    created = httpx.post(
        functions, data={"functionConfig": json.dumps(config), "url": url}, timeout=30
    )
    assert created.status_code == 204, created.text
    wait_until(
        lambda: httpx.get(f"{functions}/status", timeout=30).json()["numRunning"] == 1,
        60,
        "the packaged function running",
    )
    triggered = httpx.post(f"{functions}/trigger", data={"data": "hi"}, timeout=60)
    assert (triggered.status_code, triggered.text) == (200, "hi!")
    assert httpx.get(f"{functions}/download", timeout=30).content == CODE
    missing = httpx.post(
        f"{functions}-2",
        data={"functionConfig": json.dumps(config), "url": f"{url}-missing"},
        timeout=30,
    )
    assert (missing.status_code, missing.json()) == (
        404,
        {"reason": f"Package '{url}-missing' metadata does not exist"},
    )
