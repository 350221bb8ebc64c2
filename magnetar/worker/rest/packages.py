"""Apache Pulsar's package management paths, ``/admin/v3/packages/{type}/{tenant}/
{namespace}/{packageName}/{version}`` (``pulsar-admin packages``): upload with metadata,
download, metadata get and update, delete, and the lists of versions and of packages."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Body, File, Form, Request, UploadFile
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from magnetar.worker.package_registry import PackageName, PackageRegistry
from magnetar.worker.rest.errors import ApiError
from magnetar.worker.rest.services import RestServices

__all__ = ["packages_router"]

packages_router = APIRouter(prefix="/admin/v3/packages", tags=["packages"])

_VERSION = "/{type_}/{tenant}/{namespace}/{package_name}/{version}"


def _services(request: Request) -> tuple[RestServices, PackageRegistry]:
    services: RestServices = request.app.state.services
    if services.package_registry is None:
        raise ApiError(503, "this worker serves no package management")
    return services, services.package_registry


def _authorization(request: Request) -> str | None:
    return request.headers.get("authorization")


@packages_router.post(_VERSION, status_code=204)
async def upload(
    request: Request,
    type_: str,
    tenant: str,
    namespace: str,
    package_name: str,
    version: str,
    file: Annotated[UploadFile | None, File(description="The package's content")] = None,
    metadata: Annotated[str | None, Form(description="PackageMetadata JSON")] = None,
) -> None:
    """Upload a version: multipart ``file`` and ``metadata`` (description, contact,
    properties)."""
    services, registry = _services(request)
    name = PackageName(type_, tenant, namespace, package_name, version)
    await run_in_threadpool(services.tenancy.check_namespace, tenant, namespace)
    if file is None:
        raise ApiError(400, "Package file is not provided")
    try:
        described = json.loads(metadata) if metadata else {}
    except json.JSONDecodeError as error:
        raise ApiError(400, f"metadata is not valid JSON: {error}") from None
    limit = services.config.max_package_bytes
    content = await file.read(limit + 1)
    if len(content) > limit:
        raise ApiError(413, f"the package is larger than {limit} bytes")
    filename = file.filename or f"{package_name}-{version}"
    ref = await run_in_threadpool(services.packages.upload, content, filename)
    await run_in_threadpool(registry.upload, name, ref, described, _authorization(request))


@packages_router.get(_VERSION, response_class=FileResponse)
def download(
    request: Request, type_: str, tenant: str, namespace: str, package_name: str, version: str
) -> FileResponse:
    """The content of a version, as it was uploaded."""
    services, registry = _services(request)
    ref = registry.ref(PackageName(type_, tenant, namespace, package_name, version))
    path = services.packages.fetch(ref)
    return FileResponse(path, media_type="application/octet-stream", filename=ref.filename)


@packages_router.delete(_VERSION, status_code=204)
def delete(
    request: Request, type_: str, tenant: str, namespace: str, package_name: str, version: str
) -> None:
    _, registry = _services(request)
    name = PackageName(type_, tenant, namespace, package_name, version)
    registry.delete(name, _authorization(request))


@packages_router.get(_VERSION + "/metadata")
def get_metadata(
    request: Request, type_: str, tenant: str, namespace: str, package_name: str, version: str
) -> dict[str, Any]:
    """PackageMetadata: description, contact, createTime, modificationTime, properties."""
    _, registry = _services(request)
    entry = registry.get(PackageName(type_, tenant, namespace, package_name, version))
    return dict(entry["metadata"])


@packages_router.put(_VERSION + "/metadata", status_code=204)
def update_metadata(
    request: Request,
    type_: str,
    tenant: str,
    namespace: str,
    package_name: str,
    version: str,
    metadata: Annotated[dict[str, Any], Body()],
) -> None:
    _, registry = _services(request)
    name = PackageName(type_, tenant, namespace, package_name, version)
    registry.update_metadata(name, metadata, _authorization(request))


@packages_router.get("/{type_}/{tenant}/{namespace}/{package_name}")
def list_versions(
    request: Request, type_: str, tenant: str, namespace: str, package_name: str
) -> list[str]:
    _, registry = _services(request)
    return registry.versions(PackageName(type_, tenant, namespace, package_name))


@packages_router.get("/{type_}/{tenant}/{namespace}")
def list_packages(request: Request, type_: str, tenant: str, namespace: str) -> list[str]:
    _, registry = _services(request)
    return registry.packages(type_, tenant, namespace)
