"""Apache Pulsar's paths for function code files: ``GET /admin/v3/functions/{tenant}/
{namespace}/{name}/download`` (a registered function's code package, as it was uploaded:
``spark replay --fqfn`` runs it), and ``POST /admin/v3/functions/upload`` with
``GET /admin/v3/functions/download?path=`` (``functions upload/download --path``: a file kept
at a path of the caller's choosing, stored like function code)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from magnetar.worker.package_registry import PackageRegistry
from magnetar.worker.packages import PackageRef
from magnetar.worker.rest.errors import ApiError
from magnetar.worker.rest.services import RestServices

__all__ = ["download_router"]

download_router = APIRouter(prefix="/admin/v3/functions", tags=["functions"])


def _registry(services: RestServices) -> PackageRegistry:
    if services.package_registry is None:
        raise ApiError(503, "this worker serves no package management")
    return services.package_registry


@download_router.get("/{tenant}/{namespace}/{name}/download", response_class=FileResponse)
def download(request: Request, tenant: str, namespace: str, name: str) -> FileResponse:
    """The function's code file; its name is in ``Content-Disposition``."""
    services: RestServices = request.app.state.services
    fqfn = f"{tenant}/{namespace}/{name}"
    record = services.metadata.get(fqfn)
    if record is None:
        raise ApiError(404, f"Function {name} doesn't exist")
    if not record.package:
        raise ApiError(404, f"Function {name} has no code package")
    ref = PackageRef.from_json(record.package)
    path = services.packages.fetch(ref)  # from the packages topic unless cached here
    return FileResponse(path, media_type="application/octet-stream", filename=ref.filename)


@download_router.post("/upload", status_code=204)
async def upload_file(
    request: Request,
    data: Annotated[UploadFile | None, File(description="The file")] = None,
    path: Annotated[str | None, Form(description="Where to keep it")] = None,
) -> None:
    """Keep a file at ``path`` (``functions upload --source-file F --path P``)."""
    services: RestServices = request.app.state.services
    registry = _registry(services)
    if data is None or not path:
        raise ApiError(400, f"Function Package is not provided {path}")
    limit = services.config.max_package_bytes
    content = await data.read(limit + 1)
    if len(content) > limit:
        raise ApiError(413, f"the file is larger than {limit} bytes")
    # the path's last part names the cached file, when it is a plain name
    filename = path.rstrip("/").rsplit("/", 1)[-1]
    if filename in ("", ".", "..") or any(c in filename for c in "\\\0"):
        filename = "file"
    ref = await run_in_threadpool(services.packages.upload, content, filename)
    authorization = request.headers.get("authorization")
    await run_in_threadpool(registry.put_file, path, ref, authorization)


@download_router.get("/download", response_class=FileResponse)
def download_file(request: Request, path: Annotated[str, Query()]) -> FileResponse:
    """The file ``functions upload`` kept at ``path``."""
    services: RestServices = request.app.state.services
    ref = _registry(services).file(path)
    return FileResponse(
        services.packages.fetch(ref), media_type="application/octet-stream", filename=ref.filename
    )
