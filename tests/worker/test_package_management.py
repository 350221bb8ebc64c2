"""Apache Pulsar's package management on the worker (``/admin/v3/packages/...``): upload
with metadata, download, metadata get and update, versions, packages, delete; and
``functions upload/download --path``; asked of a worker that is not the leader."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx

from tests.conftest import EXAMPLES
from tests.worker.conftest import InProcessCluster

PACKAGES = "/admin/v3/packages"
CODE = (EXAMPLES / "exclamation.py").read_bytes()


def call(cluster: InProcessCluster, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, cluster.url("follower") + path, timeout=30, **kwargs)


def test_a_package_version_is_uploaded_described_listed_and_deleted(
    rest_cluster: InProcessCluster,
) -> None:
    name = f"pkg{uuid.uuid4().hex[:6]}"
    base = f"{PACKAGES}/function/public/default/{name}"
    metadata = {"description": "shouts", "contact": "ops", "properties": {"team": "a"}}
    uploaded = call(
        rest_cluster,
        "POST",
        f"{base}/v1",
        files={"file": ("exclamation.py", CODE)},
        data={"metadata": json.dumps(metadata)},
    )
    assert (uploaded.status_code, uploaded.content) == (204, b""), uploaded.text
    again = call(rest_cluster, "POST", f"{base}/v1", files={"file": ("e.py", CODE)})
    assert (again.status_code, again.json()) == (
        409,
        {"reason": f"Package 'function://public/default/{name}@v1' metadata already exists"},
    )
    call(
        rest_cluster,
        "POST",
        f"{base}/v2",
        files={"file": ("e.py", b"def process(i):\n  return i\n")},
    )

    downloaded = call(rest_cluster, "GET", f"{base}/v1")
    assert (downloaded.status_code, downloaded.content) == (200, CODE)
    described = call(rest_cluster, "GET", f"{base}/v1/metadata").json()
    assert {k: described[k] for k in ("description", "contact", "properties")} == metadata
    assert described["createTime"] == described["modificationTime"] > 0
    updated = call(rest_cluster, "PUT", f"{base}/v1/metadata", json={"description": "louder"})
    assert updated.status_code == 204, updated.text
    redescribed = call(rest_cluster, "GET", f"{base}/v1/metadata").json()
    assert redescribed["description"] == "louder"
    assert redescribed["createTime"] == described["createTime"]
    assert call(rest_cluster, "GET", base).json() == ["v1", "v2"]
    listed = call(rest_cluster, "GET", f"{PACKAGES}/function/public/default").json()
    assert f"function://public/default/{name}" in listed

    assert call(rest_cluster, "DELETE", f"{base}/v2").status_code == 204
    assert call(rest_cluster, "GET", base).json() == ["v1"]
    gone = call(rest_cluster, "GET", f"{base}/v2/metadata")
    assert (gone.status_code, gone.json()) == (
        404,
        {"reason": f"Package 'function://public/default/{name}@v2' metadata does not exist"},
    )
    assert call(rest_cluster, "DELETE", f"{base}/v2").status_code == 404
    unknown = call(rest_cluster, "GET", f"{PACKAGES}/function/public/default/nothing")
    assert (unknown.status_code, unknown.json()) == (
        404,
        {"reason": "Package 'function://public/default/nothing' does not exist"},
    )
    bad_type = call(rest_cluster, "GET", f"{PACKAGES}/jar/public/default/x/v1/metadata")
    assert bad_type.status_code == 412
    assert "Invalid package type 'jar'" in bad_type.json()["reason"]
    no_namespace = call(
        rest_cluster,
        "POST",
        f"{PACKAGES}/function/public/nowhere/x/v1",
        files={"file": ("e.py", CODE)},
    )
    assert (no_namespace.status_code, no_namespace.json()) == (
        400,
        {"reason": "Namespace does not exist"},
    )


def test_a_file_is_kept_at_a_path_and_downloaded_from_any_worker(
    rest_cluster: InProcessCluster,
) -> None:
    path = f"files/{uuid.uuid4().hex[:6]}/exclamation.py"
    kept = call(
        rest_cluster,
        "POST",
        "/admin/v3/functions/upload",
        files={"data": ("e.py", CODE)},
        data={"path": path},
    )
    assert (kept.status_code, kept.content) == (204, b""), kept.text
    leader = httpx.get(
        rest_cluster.url("leader") + "/admin/v3/functions/download", params={"path": path}
    )
    assert (leader.status_code, leader.content) == (200, CODE)
    missing = call(rest_cluster, "GET", "/admin/v3/functions/download", params={"path": "nope"})
    assert (missing.status_code, missing.json()) == (
        404,
        {"reason": "Function package nope does not exist"},
    )
    no_file = call(rest_cluster, "POST", "/admin/v3/functions/upload", data={"path": path})
    assert (no_file.status_code, no_file.json()) == (
        400,
        {"reason": f"Function Package is not provided {path}"},
    )
