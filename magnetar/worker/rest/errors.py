"""Errors as Pulsar's REST API returns them: JSON ``{"reason": ...}`` with a 4xx/503 code."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from magnetar.exceptions import MagnetarError
from magnetar.instance.exceptions import FunctionLoadError, InvalidFunctionConfigError
from magnetar.worker.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BrokerAdminError,
    LeaderUnavailableError,
    NotLeaderError,
    ReplicationTimeoutError,
    RequestRefusedError,
)

__all__ = ["ApiError", "install_error_handlers"]

_STATUS: list[tuple[type[MagnetarError], int]] = [
    (InvalidFunctionConfigError, 400),
    (FunctionLoadError, 400),
    (AuthenticationError, 401),
    (AuthorizationError, 401),  # as Pulsar answers a role that may not
    (NotLeaderError, 503),
    (LeaderUnavailableError, 503),
    (ReplicationTimeoutError, 503),
    (BrokerAdminError, 503),
]


class ApiError(Exception):
    """An error answer with its status code."""

    def __init__(self, status_code: int, reason: str) -> None:
        super().__init__(reason)
        self.status_code = status_code
        self.reason = reason


def _json(status_code: int, reason: str) -> JSONResponse:
    return JSONResponse({"reason": reason}, status_code=status_code)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return _json(error.status_code, error.reason)

    @app.exception_handler(MagnetarError)
    async def magnetar_error(request: Request, error: MagnetarError) -> JSONResponse:
        if isinstance(error, RequestRefusedError):
            return _json(error.status_code, error.reason)
        for kind, status_code in _STATUS:
            if isinstance(error, kind):
                response = _json(status_code, str(error))
                if status_code == 401:
                    response.headers["WWW-Authenticate"] = "Bearer"
                return response
        return _json(500, str(error))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        response = _json(error.status_code, str(error.detail))
        for name, value in (error.headers or {}).items():
            response.headers[name] = value
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in item['loc'][1:]) or 'body'}: {item['msg']}"
            for item in error.errors()
        )
        return _json(400, f"invalid request: {problems}")
