"""Apache Pulsar's Functions v3 paths: register, update, delete, get, list, status,
start and stop."""

from __future__ import annotations

import json
from pathlib import PurePath
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, File, Form, Request, UploadFile
from starlette.concurrency import run_in_threadpool

from magnetar.instance.config import FunctionConfig
from magnetar.instance.exceptions import FunctionLoadError
from magnetar.worker.functions import FunctionChange
from magnetar.worker.metadata import FunctionRecord
from magnetar.worker.model import instance_key
from magnetar.worker.rest.errors import ApiError
from magnetar.worker.rest.services import RestServices

__all__ = ["functions_router"]

functions_router = APIRouter(prefix="/admin/v3/functions", tags=["functions"])

_MAX_PACKAGE_BYTES = 100 * 1024 * 1024


def _services(request: Request) -> RestServices:
    services: RestServices = request.app.state.services
    return services


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
    await run_in_threadpool(services.functions.submit, change)


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
        services.functions.submit, FunctionChange("update", fqfn, config, package)
    )


@functions_router.delete("/{tenant}/{namespace}/{name}")
def delete(request: Request, tenant: str, namespace: str, name: str) -> None:
    services = _services(request)
    fqfn = f"{tenant}/{namespace}/{name}"
    _record(services, fqfn)
    services.functions.submit(FunctionChange("delete", fqfn))


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


@functions_router.get("/{tenant}/{namespace}/{name}/status")
def status(request: Request, tenant: str, namespace: str, name: str) -> dict[str, Any]:
    """FunctionStatus: every instance's status, asked of the worker that runs it."""
    services = _services(request)
    fqfn = f"{tenant}/{namespace}/{name}"
    record = _record(services, fqfn)
    instances = [
        _instance_status(services, record, i) for i in range(record.function_config().parallelism)
    ]
    return {
        "numInstances": len(instances),
        "numRunning": sum(1 for i in instances if i["status"]["running"]),
        "instances": instances,
    }


@functions_router.get("/{tenant}/{namespace}/{name}/{instance_id}/status")
def instance_status(
    request: Request, tenant: str, namespace: str, name: str, instance_id: int
) -> dict[str, Any]:
    services = _services(request)
    record = _record(services, f"{tenant}/{namespace}/{name}")
    if not 0 <= instance_id < record.function_config().parallelism:
        raise ApiError(404, f"function {record.fqfn} has no instance {instance_id}")
    return _instance_status(services, record, instance_id)["status"]  # type: ignore[no-any-return]


def _instance_status(
    services: RestServices, record: FunctionRecord, instance_id: int
) -> dict[str, Any]:
    key = instance_key(record.fqfn, instance_id)
    current = services.assignments.current
    owner = current.assignment.get(key) if current else None
    if instance_id in record.stopped or owner is None:
        why = "stopped" if instance_id in record.stopped else "not assigned to any worker"
        return _not_running(instance_id, why)
    if owner == services.config.worker_id:
        snapshot = services.instances.status(key)
        if snapshot is None:
            return _not_running(instance_id, "starting")
        return snapshot.status()
    return _remote_status(services, record, instance_id, owner)


def _remote_status(
    services: RestServices, record: FunctionRecord, instance_id: int, owner: str
) -> dict[str, Any]:
    current = services.assignments.current
    urls = {w.worker_id: w.admin_url for w in (current.workers if current else [])}
    url = urls.get(owner)
    if url is None:
        return _not_running(instance_id, f"worker {owner} is unknown")
    try:
        response = httpx.get(
            f"{url.rstrip('/')}/admin/v3/functions/{record.fqfn}/{instance_id}/status",
            timeout=services.config.request_timeout_s,
        )
        response.raise_for_status()
    except httpx.HTTPError as error:
        return _not_running(instance_id, f"worker {owner} did not answer: {error}")
    return {"instanceId": instance_id, "status": response.json()}


def _not_running(instance_id: int, why: str) -> dict[str, Any]:
    return {
        "instanceId": instance_id,
        "status": {
            "running": False,
            "error": why,
            "numRestarts": 0,
            "numReceived": 0,
            "numSuccessfullyProcessed": 0,
            "numUserExceptions": 0,
            "latestUserExceptions": [],
            "numSystemExceptions": 0,
            "latestSystemExceptions": [],
            "averageLatency": 0.0,
            "lastInvocationTime": 0,
            "workerId": "",
        },
    }


def _run_state(
    request: Request, tenant: str, namespace: str, name: str, op: str, instance_id: int | None
) -> None:
    services = _services(request)
    fqfn = f"{tenant}/{namespace}/{name}"
    _record(services, fqfn)
    services.functions.submit(FunctionChange(op, fqfn, instance_id=instance_id))  # type: ignore[arg-type]


@functions_router.post("/{tenant}/{namespace}/{name}/start")
def start(request: Request, tenant: str, namespace: str, name: str) -> None:
    _run_state(request, tenant, namespace, name, "start", None)


@functions_router.post("/{tenant}/{namespace}/{name}/stop")
def stop(request: Request, tenant: str, namespace: str, name: str) -> None:
    _run_state(request, tenant, namespace, name, "stop", None)


@functions_router.post("/{tenant}/{namespace}/{name}/{instance_id}/start")
def start_instance(
    request: Request, tenant: str, namespace: str, name: str, instance_id: int
) -> None:
    _run_state(request, tenant, namespace, name, "start", instance_id)


@functions_router.post("/{tenant}/{namespace}/{name}/{instance_id}/stop")
def stop_instance(
    request: Request, tenant: str, namespace: str, name: str, instance_id: int
) -> None:
    _run_state(request, tenant, namespace, name, "stop", instance_id)
