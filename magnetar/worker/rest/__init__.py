"""The worker's REST admin API (FastAPI), compatible with Apache Pulsar's paths."""

from __future__ import annotations

from fastapi import Depends, FastAPI

from magnetar import __version__
from magnetar.worker.rest.auth import authenticate_worker, authorize_request
from magnetar.worker.rest.cluster import cluster_router
from magnetar.worker.rest.console import console_router
from magnetar.worker.rest.download import download_router
from magnetar.worker.rest.errors import install_error_handlers
from magnetar.worker.rest.functions import functions_router
from magnetar.worker.rest.instances import instances_router
from magnetar.worker.rest.limits import BodyLimit
from magnetar.worker.rest.logs import logs_router
from magnetar.worker.rest.metrics import metrics_router
from magnetar.worker.rest.packages import packages_router
from magnetar.worker.rest.services import InstanceStatuses, RestServices
from magnetar.worker.rest.state import state_router
from magnetar.worker.rest.tenants import tenants_router
from magnetar.worker.rest.trigger import trigger_router

__all__ = ["InstanceStatuses", "RestServices", "create_app"]

_FORM_OVERHEAD = 1024 * 1024
"""Room in a request for the form fields around the largest package."""


def create_app(services: RestServices) -> FastAPI:
    """The admin API of one worker, serving from ``services``."""
    app = FastAPI(
        title="Magnetar worker",
        version=__version__,
        dependencies=[Depends(authorize_request), Depends(authenticate_worker)],
    )
    app.state.services = services
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=services.config.max_package_bytes + _FORM_OVERHEAD)
    app.include_router(cluster_router)
    # before the functions' routes, whose /{instance_id}/... paths would take /state/...
    app.include_router(state_router)
    app.include_router(logs_router)
    app.include_router(functions_router)
    app.include_router(download_router)
    app.include_router(instances_router)
    app.include_router(trigger_router)
    app.include_router(metrics_router)
    app.include_router(tenants_router)
    if services.config.console_enabled:
        app.include_router(console_router)
    app.include_router(packages_router)

    @app.get("/version", tags=["worker"])
    def version() -> dict[str, str]:
        return {"version": __version__}

    return app
