"""`magnetar tenants ...` and `magnetar namespaces ...`: `pulsar-admin`'s verbs for the
tenants and namespaces functions live in, over the worker's REST API (which keeps them in
the cluster, or relays them to the Apache Pulsar broker given ``--pulsar-admin-url``).

As ``pulsar-admin``: lists print one name a line, ``get`` prints JSON, a change prints
nothing, an error prints the reason and exits with 1.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import click

from magnetar.cli.admin import admin_client
from magnetar.cli.render import emit_json

if TYPE_CHECKING:
    from magnetar.cli.app import CliContext

__all__ = ["namespaces", "tenants"]


def _names(obj: CliContext, names: list[str]) -> None:
    if obj.output == "json":
        emit_json(names)
    else:
        for name in names:
            click.echo(name)


def _split(value: str | None) -> list[str] | None:
    """A comma-separated option (``--admin-roles a,b``); None when not given."""
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def _tenant_path(tenant: str) -> str:
    return f"/admin/v2/tenants/{quote(tenant, safe='')}"


def _namespace_path(namespace: str) -> str:
    tenant, _, local = namespace.partition("/")
    if not tenant or not local or "/" in local:
        raise click.BadParameter(
            f"{namespace!r} is not tenant/namespace", param_hint="'TENANT/NAMESPACE'"
        )
    return f"/admin/v2/namespaces/{quote(tenant, safe='')}/{quote(local, safe='')}"


_ADMIN_ROLES = click.option(
    "--admin-roles",
    "-r",
    help="Comma-separated roles allowed to administrate the tenant.",
)
_FORCE = click.option(
    "--force", "-f", is_flag=True, help="Delete what it holds too (refused unless allowed)."
)


@click.group()
def tenants() -> None:
    """Operations about tenants (like `pulsar-admin tenants`)."""


@tenants.command("list")
@click.pass_obj
def list_tenants(obj: CliContext) -> None:
    """List the existing tenants.

    \b
    Example:
      magnetar tenants list
    """
    _names(obj, admin_client(obj).get_json("/admin/v2/tenants"))


@tenants.command("get")
@click.argument("tenant")
@click.pass_obj
def get_tenant(obj: CliContext, tenant: str) -> None:
    """Show a tenant's admin roles and allowed clusters.

    \b
    Example:
      magnetar tenants get public
    """
    info = admin_client(obj).get_json(_tenant_path(tenant))
    if obj.output == "json":
        emit_json(info)
    else:
        click.echo(json.dumps(info, indent=2))


@tenants.command("create")
@click.argument("tenant")
@_ADMIN_ROLES
@click.option(
    "--allowed-clusters",
    "-c",
    help="Comma-separated clusters the tenant may use [default: all clusters].",
)
@click.pass_obj
def create_tenant(
    obj: CliContext, tenant: str, admin_roles: str | None, allowed_clusters: str | None
) -> None:
    """Create a tenant.

    \b
    Example:
      magnetar tenants create acme --admin-roles acme-admin
    """
    client = admin_client(obj)
    clusters = _split(allowed_clusters) or client.get_json("/admin/v2/clusters")
    info = {"adminRoles": _split(admin_roles) or [], "allowedClusters": clusters}
    client.request("PUT", _tenant_path(tenant), json=info)


@tenants.command("update")
@click.argument("tenant")
@_ADMIN_ROLES
@click.option(
    "--allowed-clusters",
    "-c",
    help="Comma-separated clusters the tenant may use [default: unchanged].",
)
@click.pass_obj
def update_tenant(
    obj: CliContext, tenant: str, admin_roles: str | None, allowed_clusters: str | None
) -> None:
    """Change a tenant's admin roles or allowed clusters; what is not given stays.

    \b
    Example:
      magnetar tenants update acme --admin-roles acme-admin,ops
    """
    client = admin_client(obj)
    roles, clusters = _split(admin_roles), _split(allowed_clusters)
    if roles is None or clusters is None:
        current: dict[str, Any] = client.get_json(_tenant_path(tenant))
        roles = current.get("adminRoles", []) if roles is None else roles
        clusters = current.get("allowedClusters", []) if clusters is None else clusters
    client.request(
        "POST", _tenant_path(tenant), json={"adminRoles": roles, "allowedClusters": clusters}
    )


@tenants.command("delete")
@click.argument("tenant")
@_FORCE
@click.pass_obj
def delete_tenant(obj: CliContext, tenant: str, force: bool) -> None:
    """Delete a tenant that has no namespace left.

    \b
    Example:
      magnetar tenants delete acme
    """
    params = {"force": "true"} if force else None
    admin_client(obj).request("DELETE", _tenant_path(tenant), params=params)


@click.group()
def namespaces() -> None:
    """Operations about namespaces (like `pulsar-admin namespaces`)."""


@namespaces.command("list")
@click.argument("tenant")
@click.pass_obj
def list_namespaces(obj: CliContext, tenant: str) -> None:
    """List the namespaces of a tenant.

    \b
    Example:
      magnetar namespaces list public
    """
    _names(obj, admin_client(obj).get_json(f"/admin/v2/namespaces/{quote(tenant, safe='')}"))


@namespaces.command("create")
@click.argument("namespace", metavar="TENANT/NAMESPACE")
@click.option("--bundles", "-b", type=click.IntRange(min=1), help="Number of bundles.")
@click.option("--clusters", "-c", help="Comma-separated replication clusters.")
@click.pass_obj
def create_namespace(
    obj: CliContext, namespace: str, bundles: int | None, clusters: str | None
) -> None:
    """Create a namespace, where functions can then be created.

    \b
    Example:
      magnetar namespaces create acme/prod
    """
    policies: dict[str, Any] = {}
    if bundles is not None:
        policies["bundles"] = {"numBundles": bundles}
    if clusters is not None:
        policies["replication_clusters"] = _split(clusters)
    admin_client(obj).request("PUT", _namespace_path(namespace), json=policies or None)


@namespaces.command("delete")
@click.argument("namespace", metavar="TENANT/NAMESPACE")
@_FORCE
@click.pass_obj
def delete_namespace(obj: CliContext, namespace: str, force: bool) -> None:
    """Delete a namespace that holds no function.

    \b
    Example:
      magnetar namespaces delete acme/prod
    """
    params = {"force": "true"} if force else None
    admin_client(obj).request("DELETE", _namespace_path(namespace), params=params)
