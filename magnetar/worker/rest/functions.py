"""Apache Pulsar's Functions v3 paths for the functions themselves: register, update,
delete, get and list."""

from __future__ import annotations

import json
from pathlib import PurePath
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Request, UploadFile
from starlette.concurrency import run_in_threadpool

from magnetar.instance.config import FunctionConfig
from magnetar.instance.exceptions import FunctionLoadError
from magnetar.worker.functions import FunctionChange
from magnetar.worker.metadata import FunctionRecord
from magnetar.worker.rest.errors import ApiError
from magnetar.worker.rest.services import RestServices

__all__ = ["functions_router"]

functions_router = APIRouter(prefix="/admin/v3/functions", tags=["functions"])

_MAX_PACKAGE_BYTES = 100 * 1024 * 1024


def _services(request: Request) -> RestServices:
    services: RestServices = request.app.state.services
    return services


def _credentials(request: Request) -> str | None:
    """The caller's Authorization header, passed on when a change goes to the leader."""
    return request.headers.get("authorization")


def _record(services: RestServices, fqfn: str) -> FunctionRecord:
    record = services.metadata.get(fqfn)
    if record is None:
        raise ApiError(404, f"function {fqfn} doesn't exist")
    return record


def _config(raw: str, tenant: str, namespace: str, name: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ApiError(400, f"functionConfig is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "functionConfig must be a JSON object")
    for field, value in (("tenant", tenant), ("namespace", namespace), ("name", name)):
        if data.setdefault(field, value) != value:
            raise ApiError(
                400, f"functionConfig {field} {data[field]!r} does not match the path ({value!r})"
            )
    return data


async def _package(
    services: RestServices, data: UploadFile, config: dict[str, Any]
) -> dict[str, Any]:
    content = await data.read(_MAX_PACKAGE_BYTES + 1)
    if len(content) > _MAX_PACKAGE_BYTES:
        raise ApiError(413, f"the function package is larger than {_MAX_PACKAGE_BYTES} bytes")
    filename = PurePath(data.filename or config.get("py") or "function.py").name
    if filename.endswith(".py"):
        try:
            compile(content, filename, "exec")
        except SyntaxError as error:
            raise FunctionLoadError(
                f"syntax error in {filename}, line {error.lineno}, column {error.offset}: "
                f"{error.msg}"
            ) from None
    elif not filename.endswith(".zip"):
        raise ApiError(400, f"the function package {filename!r} must be a .py file or a .zip")
    ref = await run_in_threadpool(services.packages.upload, content, filename)
    config["py"] = filename
    return ref.to_json()


@functions_router.post("/{tenant}/{namespace}/{name}")
async def register(
    request: Request,
    tenant: str,
    namespace: str,
    name: str,
    function_config: Annotated[str, Form(alias="functionConfig")],
    data: Annotated[UploadFile, File()],
) -> None:
    """Register a function: multipart ``functionConfig`` (JSON) and ``data`` (the code)."""
    services = _services(request)
    config = _config(function_config, tenant, namespace, name)
    FunctionConfig.parse({**config, "py": config.get("py") or "function.py"})
    package = await _package(services, data, config)
    FunctionConfig.parse(config)
    change = FunctionChange("register", f"{tenant}/{namespace}/{name}", config, package)
    await run_in_threadpool(services.functions.submit, change, _credentials(request))


@functions_router.put("/{tenant}/{namespace}/{name}")
async def update(
    request: Request,
    tenant: str,
    namespace: str,
    name: str,
    function_config: Annotated[str, Form(alias="functionConfig")],
    data: Annotated[UploadFile | None, File()] = None,
) -> None:
    """Update a function's config and, with ``data``, its code."""
    services = _services(request)
    fqfn = f"{tenant}/{namespace}/{name}"
    current = _record(services, fqfn)
    config = {**current.config, **_config(function_config, tenant, namespace, name)}
    package = await _package(services, data, config) if data is not None else None
    FunctionConfig.parse(config)
    await run_in_threadpool(
        services.functions.submit,
        FunctionChange("update", fqfn, config, package),
        _credentials(request),
    )


@functions_router.delete("/{tenant}/{namespace}/{name}")
def delete(request: Request, tenant: str, namespace: str, name: str) -> None:
    services = _services(request)
    fqfn = f"{tenant}/{namespace}/{name}"
    _record(services, fqfn)
    services.functions.submit(FunctionChange("delete", fqfn), _credentials(request))


@functions_router.get("/{tenant}/{namespace}/{name}")
def get(request: Request, tenant: str, namespace: str, name: str) -> dict[str, Any]:
    """The FunctionConfig, in Pulsar's field names."""
    return dict(_record(_services(request), f"{tenant}/{namespace}/{name}").config)


@functions_router.get("/{tenant}/{namespace}")
def list_functions(request: Request, tenant: str, namespace: str) -> list[str]:
    prefix = f"{tenant}/{namespace}/"
    return sorted(
        fqfn.removeprefix(prefix)
        for fqfn in _services(request).metadata.functions()
        if fqfn.startswith(prefix)
    )
