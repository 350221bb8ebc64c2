"""Tenants and namespaces as Apache Pulsar has them, kept by the workers in the metadata
topic: ``public/default`` and the system namespace from the start, Pulsar's admin paths
with its codes and reasons (TenantsBase, NamespacesBase), every worker agreeing, and
functions only in namespaces that exist."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import EXAMPLES
from tests.worker.conftest import InProcessCluster

STANDALONE = {"adminRoles": [], "allowedClusters": ["standalone"]}


def call(
    cluster: InProcessCluster, method: str, path: str, via: str = "follower", **kwargs: Any
) -> httpx.Response:
    return httpx.request(method, cluster.url(via) + path, timeout=30, **kwargs)


def register(cluster: InProcessCluster, fqfn: str) -> httpx.Response:
    config = {
        "inputs": [f"in-{fqfn.replace('/', '-')}"],
        "className": "exclamation.ExclamationFunction",
    }
    return call(
        cluster,
        "POST",
        f"/admin/v3/functions/{fqfn}",
        data={"functionConfig": json.dumps(config)},
        files={"data": ("exclamation.py", (EXAMPLES / "exclamation.py").read_bytes())},
    )


def test_public_default_and_the_system_namespace_exist_from_the_start(
    rest_cluster: InProcessCluster,
) -> None:
    system = rest_cluster.settings["system_namespace"]
    for via in ("leader", "follower"):
        assert call(rest_cluster, "GET", "/admin/v2/clusters", via).json() == ["standalone"]
        assert call(rest_cluster, "GET", "/admin/v2/tenants", via).json() == ["public"]
        assert call(rest_cluster, "GET", "/admin/v2/tenants/public", via).json() == STANDALONE
        namespaces = call(rest_cluster, "GET", "/admin/v2/namespaces/public", via).json()
        assert namespaces == sorted(["public/default", system])


# (method, path, JSON body or None, status, reason)
REFUSALS: dict[str, tuple[str, str, Any, int, str]] = {
    "get a missing tenant": ("GET", "/admin/v2/tenants/ghost", None, 404, "Tenant does not exist"),
    "create an existing tenant": (
        "PUT",
        "/admin/v2/tenants/public",
        STANDALONE,
        409,
        "Tenant already exist",
    ),
    "create a tenant with an invalid name": (
        "PUT",
        "/admin/v2/tenants/bad%20name",
        STANDALONE,
        412,
        "Tenant name is not valid",
    ),
    "create a tenant with a name beyond ASCII": (
        "PUT",
        "/admin/v2/tenants/caf%C3%A9",
        STANDALONE,
        412,
        "Tenant name is not valid",
    ),
    "create a tenant without TenantInfo": (
        "PUT",
        "/admin/v2/tenants/t1",
        None,
        412,
        "TenantInfo is null",
    ),
    "create a tenant without clusters": (
        "PUT",
        "/admin/v2/tenants/t1",
        {"adminRoles": []},
        412,
        "Clusters cannot be null",
    ),
    "create a tenant with no cluster": (
        "PUT",
        "/admin/v2/tenants/t1",
        {"allowedClusters": []},
        412,
        "Clusters cannot be empty or blank",
    ),
    "create a tenant on an unknown cluster": (
        "PUT",
        "/admin/v2/tenants/t1",
        {"allowedClusters": ["mars"]},
        412,
        "Clusters do not exist",
    ),
    "create a tenant with a padded admin role": (
        "PUT",
        "/admin/v2/tenants/t1",
        {"allowedClusters": ["standalone"], "adminRoles": [" admin"]},
        412,
        "AdminRoles contains whitespace in the beginning or end.",
    ),
    "update a missing tenant": (
        "POST",
        "/admin/v2/tenants/ghost",
        STANDALONE,
        404,
        "Tenant ghost not found",
    ),
    "delete a missing tenant": (
        "DELETE",
        "/admin/v2/tenants/ghost",
        None,
        404,
        "Tenant doesn't exist",
    ),
    "delete a tenant with namespaces": (
        "DELETE",
        "/admin/v2/tenants/public",
        None,
        409,
        "The tenant still has active namespaces",
    ),
    "force-delete a tenant": (
        "DELETE",
        "/admin/v2/tenants/public?force=true",
        None,
        405,
        "Broker doesn't allow forced deletion of tenants",
    ),
    "list the namespaces of a missing tenant": (
        "GET",
        "/admin/v2/namespaces/ghost",
        None,
        404,
        "Tenant not found",
    ),
    "create a namespace in a missing tenant": (
        "PUT",
        "/admin/v2/namespaces/ghost/ns",
        None,
        404,
        "Tenant does not exist",
    ),
    "create an existing namespace": (
        "PUT",
        "/admin/v2/namespaces/public/default",
        None,
        409,
        "Namespace already exists",
    ),
    "create a namespace with an invalid name": (
        "PUT",
        "/admin/v2/namespaces/public/bad%20ns",
        None,
        412,
        "Namespace name is not valid",
    ),
    "create a namespace on a cluster the tenant may not use": (
        "PUT",
        "/admin/v2/namespaces/public/elsewhere",
        {"replication_clusters": ["mars"]},
        403,
        "Cluster [mars] is not in the list of allowed clusters list for tenant [public]",
    ),
    "delete a missing namespace": (
        "DELETE",
        "/admin/v2/namespaces/public/ghost",
        None,
        404,
        "Namespace public/ghost does not exist.",
    ),
    "force-delete a namespace": (
        "DELETE",
        "/admin/v2/namespaces/public/default?force=true",
        None,
        405,
        "Broker doesn't allow forced deletion of namespaces",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_answer_pulsars_code_and_reason(rest_cluster: InProcessCluster, case: str) -> None:
    method, path, body, status, reason = REFUSALS[case]
    answer = call(rest_cluster, method, path, json=body)
    assert (answer.status_code, answer.json()) == (status, {"reason": reason})


def test_the_system_namespace_cannot_be_deleted(rest_cluster: InProcessCluster) -> None:
    system = rest_cluster.settings["system_namespace"]
    answer = call(rest_cluster, "DELETE", f"/admin/v2/namespaces/{system}")
    assert (answer.status_code, answer.json()) == (
        409,
        {"reason": "Cannot delete non empty namespace"},
    )


def test_tenants_and_namespaces_live_and_die_with_what_they_hold(
    rest_cluster: InProcessCluster,
) -> None:
    acme = {"adminRoles": ["ops", "dev"], "allowedClusters": ["standalone"]}
    created = call(rest_cluster, "PUT", "/admin/v2/tenants/acme", json=acme)
    assert (created.status_code, created.content) == (204, b"")
    # the leader applied it, so every worker (the leader too) answers with it
    expected = {"adminRoles": ["dev", "ops"], "allowedClusters": ["standalone"]}
    assert call(rest_cluster, "GET", "/admin/v2/tenants/acme", "leader").json() == expected
    assert call(rest_cluster, "GET", "/admin/v2/tenants").json() == ["acme", "public"]

    assert register(rest_cluster, "acme/prod/f").json() == {"reason": "Namespace does not exist"}
    ns = call(rest_cluster, "PUT", "/admin/v2/namespaces/acme/prod", "leader")
    assert (ns.status_code, ns.content) == (204, b"")
    assert call(rest_cluster, "GET", "/admin/v2/namespaces/acme").json() == ["acme/prod"]
    assert register(rest_cluster, "acme/prod/f").status_code == 204

    busy = call(rest_cluster, "DELETE", "/admin/v2/namespaces/acme/prod")
    assert (busy.status_code, busy.json()) == (409, {"reason": "Cannot delete non empty namespace"})
    assert call(rest_cluster, "DELETE", "/admin/v3/functions/acme/prod/f").status_code == 204
    emptied = call(rest_cluster, "DELETE", "/admin/v2/namespaces/acme/prod")
    assert (emptied.status_code, emptied.content) == (204, b"")

    update = {"adminRoles": [], "allowedClusters": ["standalone"]}
    updated = call(rest_cluster, "POST", "/admin/v2/tenants/acme", "leader", json=update)
    assert (updated.status_code, updated.content) == (204, b"")
    assert call(rest_cluster, "GET", "/admin/v2/tenants/acme").json() == update
    deleted = call(rest_cluster, "DELETE", "/admin/v2/tenants/acme")
    assert (deleted.status_code, deleted.content) == (204, b"")
    assert register(rest_cluster, "acme/prod/g").json() == {"reason": "Tenant does not exist"}


def test_a_worker_that_joins_later_replays_the_same_tenants(rest_cluster: InProcessCluster) -> None:
    assert call(rest_cluster, "PUT", "/admin/v2/tenants/later", json=STANDALONE).status_code == 204
    assert call(rest_cluster, "PUT", "/admin/v2/namespaces/later/ns").status_code == 204
    assert call(rest_cluster, "DELETE", "/admin/v2/namespaces/public/default").status_code == 204
    newcomer = rest_cluster.start_worker(f"w{len(rest_cluster.workers)}")
    rest_cluster.wait_ready()
    url = newcomer.config.admin_url
    assert httpx.get(url + "/admin/v2/tenants", timeout=10).json() == ["later", "public"]
    assert httpx.get(url + "/admin/v2/namespaces/later", timeout=10).json() == ["later/ns"]
    # a deleted default stays deleted, and may be made again
    assert "public/default" not in httpx.get(url + "/admin/v2/namespaces/public", timeout=10).json()
    assert httpx.put(url + "/admin/v2/namespaces/public/default", timeout=10).status_code == 204
