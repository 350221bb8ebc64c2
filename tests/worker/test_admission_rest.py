"""Admission as a user of the REST API sees it, on two in-process workers with low limits:
each refusal is a 400 whose reason names the rule or the limit; a package whose directory
lies is stopped as it unpacks, with the limit in the instance's status; and a bad record
neither passes the workers' internal path nor, written anyway, stops the scheduling of
another function."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from magnetar.worker.metadata import FunctionRecord
from magnetar.worker.service import WorkerService
from tests.conftest import EXAMPLES
from tests.worker.conftest import InProcessCluster
from tests.zips import lying_zip, zip_bytes

FUNCTIONS = "/admin/v3/functions/public/default"
CLASS = "exclamation.ExclamationFunction"
INTERNAL = "/admin/v2/worker/internal/function-changes"
MIB = 1 << 20


@pytest.fixture(scope="module")
def cluster(
    broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessCluster]:
    """Two workers that hold 2 instances each, 3 per function and per tenant, names up to 20
    characters and packages unpacking to 1 MiB."""
    made = InProcessCluster(
        broker_url,
        tmp_path_factory.mktemp("admission"),
        request_timeout_s=4,
        max_parallelism=3,
        max_instances_per_worker=2,
        max_instances_per_tenant=3,
        max_name_length=20,
        max_package_unpacked_bytes=MIB,
        max_package_compression_ratio=1e9,
    )
    yield made
    made.stop()


def call(
    cluster: InProcessCluster, method: str, path: str, via: str = "follower", **kwargs: Any
) -> httpx.Response:
    return httpx.request(method, cluster.url(via) + path, timeout=30, **kwargs)


def register(
    cluster: InProcessCluster,
    name: str,
    code: tuple[str, bytes] | None = None,
    functions: str = FUNCTIONS,
    **config: Any,
) -> httpx.Response:
    body = {"className": CLASS, "inputs": [f"adm-{uuid.uuid4().hex[:6]}"], **config}
    files = {"data": code or ("exclamation.py", (EXAMPLES / "exclamation.py").read_bytes())}
    return call(
        cluster,
        "POST",
        f"{functions}/{name}",
        data={"functionConfig": json.dumps(body)},
        files=files,
    )


def refused(answer: httpx.Response) -> str:
    assert answer.status_code == 400, answer.text
    reason: str = answer.json()["reason"]
    return reason


def leader_of(cluster: InProcessCluster) -> WorkerService:
    url = cluster.url("leader")
    return next(w for w in cluster.workers if w.config.admin_url == url)


def wait_status(
    cluster: InProcessCluster, name: str, done: Any, timeout: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        answer = call(cluster, "GET", f"{FUNCTIONS}/{name}/status")
        status: dict[str, Any] = answer.json()
        if answer.status_code == 200 and done(status):
            return status
        assert time.monotonic() < deadline, f"{name}: {status}"
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("parallelism", "reason"),
    [
        (0, "Function parallelism must be a positive number"),
        (
            99999999999999999999999,
            "Function parallelism 99999999999999999999999 is more than the limit of 3 instances "
            "per function (max_parallelism)",
        ),
    ],
)
def test_a_parallelism_out_of_range_is_refused(
    cluster: InProcessCluster, parallelism: int, reason: str
) -> None:
    assert refused(register(cluster, "par", parallelism=parallelism)) == reason
    assert call(cluster, "GET", f"{FUNCTIONS}/par").status_code == 404


def test_a_number_of_too_many_digits_is_a_400(cluster: InProcessCluster) -> None:
    config = json.dumps({"inputs": ["x"], "parallelism": 1}).replace("1}", "9" * 5000 + "}")
    files = {"data": ("exclamation.py", (EXAMPLES / "exclamation.py").read_bytes())}
    form = {"data": {"functionConfig": config}, "files": files}
    answer = call(cluster, "POST", f"{FUNCTIONS}/digits", **form)
    assert refused(answer).startswith("functionConfig is not valid JSON: Exceeds the limit")


RIVAL = "/admin/v3/functions/rival/ns"


@pytest.fixture(scope="module")
def rival(cluster: InProcessCluster) -> str:
    """A second tenant with a namespace, ``rival/ns``: its functions' path."""
    tenant = {"adminRoles": [], "allowedClusters": ["standalone"]}
    assert call(cluster, "PUT", "/admin/v2/tenants/rival", json=tenant).status_code == 204
    assert call(cluster, "PUT", "/admin/v2/namespaces/rival/ns").status_code == 204
    return RIVAL


def test_the_cluster_holds_instances_per_live_worker(cluster: InProcessCluster, rival: str) -> None:
    assert register(cluster, "cap1", parallelism=3).status_code == 204
    try:
        assert refused(register(cluster, "cap2", functions=rival, parallelism=2)) == (
            "Function cap2 would take the cluster to 5 instances, more than the limit of 4: "
            "2 per worker (max_instances_per_worker) x 2 live workers"
        )
        grow = {"data": {"functionConfig": json.dumps({"parallelism": 3})}}
        assert register(cluster, "cap2", functions=rival, parallelism=1).status_code == 204
        assert "more than the limit of 4" in refused(call(cluster, "PUT", f"{rival}/cap2", **grow))
        shrink = {"data": {"functionConfig": json.dumps({"parallelism": 2})}}
        assert call(cluster, "PUT", f"{FUNCTIONS}/cap1", **shrink).status_code == 204
        assert call(cluster, "PUT", f"{rival}/cap2", **grow).status_code != 204  # 2 + 3 > 4
    finally:
        call(cluster, "DELETE", f"{FUNCTIONS}/cap1")
        call(cluster, "DELETE", f"{rival}/cap2")


def test_a_tenant_at_its_limit_leaves_the_others_room(
    cluster: InProcessCluster, rival: str
) -> None:
    assert register(cluster, "mine1", parallelism=2).status_code == 204
    try:
        assert refused(register(cluster, "mine2", parallelism=2)) == (
            "Function mine2 would take tenant public to 4 instances, more than the limit of 3 "
            "per tenant (max_instances_per_tenant)"
        )
        assert call(cluster, "GET", f"{FUNCTIONS}/mine2").status_code == 404
        # the cluster still has room (2 of 4), and the other tenant gets it
        assert register(cluster, "theirs", functions=rival, parallelism=1).status_code == 204
        assert register(cluster, "mine2", parallelism=1).status_code == 204  # public: 3 of 3
    finally:
        for path in (f"{FUNCTIONS}/mine1", f"{FUNCTIONS}/mine2", f"{rival}/theirs"):
            call(cluster, "DELETE", path)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        (
            "f" * 1000,
            "Function name is 1000 characters long, more than the limit of 20 (max_name_length)",
        ),
        ("a b", "Function name 'a b' is invalid"),
        ("caf\u00e9", "Function name 'caf\u00e9' is invalid"),
    ],
)
def test_a_bad_name_is_refused(cluster: InProcessCluster, name: str, reason: str) -> None:
    assert refused(register(cluster, name)).startswith(reason)
    assert call(cluster, "DELETE", f"{FUNCTIONS}/{name}").status_code == 404


def test_a_zip_bomb_is_refused_at_registration(cluster: InProcessCluster) -> None:
    code = (EXAMPLES / "exclamation.py").read_bytes()
    bomb = zip_bytes({"exclamation.py": code, "zeros.bin": bytes(3 * MIB)})

    answer = register(cluster, "bomb", code=("bomb.zip", bomb))
    assert refused(answer) == (
        f"the function package unpacks to more than {MIB} bytes, the limit "
        "(max_package_unpacked_bytes)"
    )


def test_a_package_whose_directory_lies_stops_unpacking_at_the_limit(
    cluster: InProcessCluster,
) -> None:
    code = (EXAMPLES / "exclamation.py").read_bytes()
    data = lying_zip({"exclamation.py": code, "zeros.bin": bytes(8 * MIB)}, "zeros.bin", 100)

    assert register(cluster, "liar", code=("liar.zip", data)).status_code == 204
    try:
        status = wait_status(cluster, "liar", lambda s: s["instances"][0]["status"]["error"])
        error = status["instances"][0]["status"]["error"]
        assert "max_package_unpacked_bytes" in error and f"more than {MIB} bytes" in error
        assert status["numRunning"] == 0
    finally:
        call(cluster, "DELETE", f"{FUNCTIONS}/liar")


BAD_CONFIG = {"parallelism": "zzz", "inputs": 5}


def test_the_internal_path_validates_the_config(cluster: InProcessCluster) -> None:
    change = {"op": "register", "fqfn": "public/default/badcfg", "config": BAD_CONFIG}
    answer = call(cluster, "POST", INTERNAL, via="leader", json=change)
    assert refused(answer).startswith("invalid function config: ")
    assert "parallelism" in answer.json()["reason"]
    assert call(cluster, "GET", f"{FUNCTIONS}/badcfg").status_code == 404


def test_bad_records_stop_no_other_function(cluster: InProcessCluster) -> None:
    # as an older worker version could have written them: straight into the metadata
    huge = {
        **{"tenant": "public", "namespace": "default", "name": "huge", "inputs": ["adm-huge"]},
        **{"py": "exclamation.py", "className": CLASS, "parallelism": 10**23},
    }
    legacy = {"public/default/legacy": BAD_CONFIG, "public/default/huge": huge}
    for fqfn, config in legacy.items():
        leader_of(cluster).leader.write_function(
            fqfn, lambda current, fqfn=fqfn, config=config: FunctionRecord(fqfn, config, None)
        )
    try:
        assert register(cluster, "healthy").status_code == 204
        wait_status(cluster, "healthy", lambda s: s["numRunning"] == 1)
        # the bad ones say why they do not run
        assert refused(call(cluster, "GET", f"{FUNCTIONS}/legacy/status")).startswith(
            "invalid function config: "
        )
        assert refused(call(cluster, "GET", f"{FUNCTIONS}/huge/status")) == (
            f"Function parallelism {10**23} is more than the limit of 3 instances per function "
            "(max_parallelism)"
        )
        assert "max_parallelism" in refused(call(cluster, "POST", f"{FUNCTIONS}/huge/stop"))
    finally:
        call(cluster, "DELETE", f"{FUNCTIONS}/healthy")
        for name in ("legacy", "huge"):
            assert call(cluster, "DELETE", f"{FUNCTIONS}/{name}").status_code == 204


SCRIPT = ("fn.js", b"function process(input) { return input; }")


def with_binding(url: str) -> dict[str, Any]:
    return {"className": "process", "urlBindings": [{"alias": "api", "url": url}]}


@pytest.mark.parametrize(
    ("url", "host", "kind"),
    [
        ("http://127.0.0.1:8080/admin/v2", "127.0.0.1", "a loopback address"),
        (
            "http://169.254.169.254/latest",
            "169.254.169.254",
            "a link-local (cloud metadata) address",
        ),
        ("http://[::1]:6650/", "::1", "a loopback address"),
        ("https://10.0.0.7/api", "10.0.0.7", "a private address"),
    ],
)
def test_url_bindings_to_internal_addresses_are_refused_by_default(
    cluster: InProcessCluster, url: str, host: str, kind: str
) -> None:
    assert refused(register(cluster, "curl-in", SCRIPT, **with_binding(url))) == (
        f"urlBindings[0] (api, {url}): host {host} is {kind}, which the worker's "
        "url_binding_hosts (public) does not allow; the worker's operator decides where URL "
        "bindings may point"
    )
    assert call(cluster, "GET", f"{FUNCTIONS}/curl-in").status_code == 404
