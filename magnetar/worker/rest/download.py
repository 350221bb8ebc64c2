"""Apache Pulsar's ``GET /admin/v3/functions/{tenant}/{namespace}/{name}/download``: a
registered function's code package, as it was uploaded (``spark replay --fqfn`` runs it)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse

from magnetar.worker.packages import PackageRef
from magnetar.worker.rest.errors import ApiError
from magnetar.worker.rest.services import RestServices

__all__ = ["download_router"]

download_router = APIRouter(prefix="/admin/v3/functions", tags=["functions"])


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
