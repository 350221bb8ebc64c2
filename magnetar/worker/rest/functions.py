"""Apache Pulsar's Functions v3 paths for the functions themselves: register, update,
delete, get and list, answering as Pulsar's FunctionsImpl does: success without a body
(204), refusals with its status codes and reasons."""

from __future__ import annotations

import json
from pathlib import PurePath
from typing import Annotated, Any
from urllib.parse import urlsplit

import httpx
from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from starlette.concurrency import run_in_threadpool

from magnetar.instance.exceptions import FunctionLoadError
from magnetar.instance.javascript import DEFAULT_TIMEOUT_MS
from magnetar.worker.exceptions import FunctionExistsError, FunctionNotFoundError
from magnetar.worker.function_config import pulsar_function_config
from magnetar.worker.function_update import changes_anything, merge_update, unknown_fields
from magnetar.worker.functions import FunctionChange
from magnetar.worker.metadata import FunctionRecord
from magnetar.worker.package_registry import PACKAGE_TYPES, PackageName
from magnetar.worker.rest.auth import authorize_topics, caller_auth_data
from magnetar.worker.rest.errors import ApiError
from magnetar.worker.rest.services import RestServices
from magnetar.worker.rest.state import delete_function_state

__all__ = ["functions_router"]

functions_router = APIRouter(prefix="/admin/v3/functions", tags=["functions"])

SECRET_MASK = "******"
"""What ``get`` shows of a secret's value (its locator: with the default provider, the
secret itself). An update that sends it back keeps the value it stands for."""


def _services(request: Request) -> RestServices:
    services: RestServices = request.app.state.services
    return services


def _credentials(request: Request) -> str | None:
    """The caller's Authorization header, passed on when a change goes to the leader."""
    return request.headers.get("authorization")


def _record(services: RestServices, fqfn: str, missing_status: int = 404) -> FunctionRecord:
    record = services.metadata.get(fqfn)
    if record is None:
        name = fqfn.rsplit("/", 1)[-1]
        raise FunctionNotFoundError(f"Function {name} doesn't exist", missing_status)
    return record


def _config(raw: str | None, tenant: str, namespace: str, name: str) -> dict[str, Any]:
    """The functionConfig part; the path's tenant, namespace and name take precedence over
    the ones it holds, as in Pulsar."""
    if raw is None:
        raise ApiError(400, "Function config is not provided")
    try:
        data = json.loads(raw)
    except ValueError as error:  # a JSONDecodeError, or a number of too many digits
        raise ApiError(400, f"functionConfig is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "functionConfig must be a JSON object")
    return {**data, "tenant": tenant, "namespace": namespace, "name": name}


async def _code(
    services: RestServices, data: UploadFile | None, url: str | None
) -> tuple[bytes, str] | None:
    """The uploaded code and its file name: the ``data`` part or what ``url`` points at."""
    limit = services.config.max_package_bytes
    if data is not None and url:
        raise ApiError(400, "give the function's code as data (a file part) or url, not both")
    if data is not None:
        content = await data.read(limit + 1)
        filename = data.filename or ""
    elif url and url.startswith(_PACKAGE_SCHEMES):
        content, filename = await run_in_threadpool(_from_package, services, url)
    elif url:
        content = await run_in_threadpool(_fetch, url, limit, services.auth is None)
        filename = urlsplit(url).path
    else:
        return None
    if len(content) > limit:
        raise ApiError(413, f"the function package is larger than {limit} bytes")
    return content, PurePath(filename).name


_PACKAGE_SCHEMES = tuple(f"{kind}://" for kind in PACKAGE_TYPES)


def _from_package(services: RestServices, url: str) -> tuple[bytes, str]:
    """The content and file name of a package of Pulsar's package management."""
    if services.package_registry is None:
        raise ApiError(400, "this worker serves no package management")
    ref = services.package_registry.ref(PackageName.parse(url))
    return services.packages.fetch(ref).read_bytes(), ref.filename


def _fetch(url: str, limit: int, allow_files: bool) -> bytes:
    """A package from an http(s) URL, or a file: URL on the worker (without authentication
    only: with it, a tenant could read the worker's files)."""
    scheme = urlsplit(url).scheme
    if scheme == "file" and allow_files:
        try:
            with open(urlsplit(url).path, "rb") as file:
                return file.read(limit + 1)
        except OSError as error:
            raise ApiError(400, f"cannot read the package {url}: {error.strerror}") from None
    if scheme not in ("http", "https"):
        # Pulsar's words (its missing space included); without file: when authenticating
        allowed = "http/https/file" if allow_files else "http/https"
        raise ApiError(400, f"Function Package url is not valid.supported url ({allowed})")
    try:
        with httpx.stream("GET", url, timeout=30, follow_redirects=True) as response:
            if response.status_code != 200:
                raise ApiError(400, f"fetching {url} answered HTTP {response.status_code}")
            content = b""
            for block in response.iter_bytes():
                content += block
                if len(content) > limit:
                    break
            return content
    except httpx.HTTPError as error:
        raise ApiError(400, f"cannot fetch the package {url}: {error}") from None


async def _package(
    services: RestServices, content: bytes, filename: str, config: dict[str, Any]
) -> dict[str, Any]:
    """Check and store the code; point the config at it; the package reference."""
    filename = filename or config.get("js") or config.get("py") or "function.py"
    if filename.endswith(".js"):
        # loaded in a process of its own (see ``script_check``): a syntax error, a throwing
        # top level or a missing function is a 400 now rather than a crashing instance later
        timeout_ms = config.get("timeoutMs")
        if not isinstance(timeout_ms, int) or not 0 < timeout_ms < DEFAULT_TIMEOUT_MS:
            timeout_ms = DEFAULT_TIMEOUT_MS
        await run_in_threadpool(
            services.scripts.check, content, filename, config.get("className"), timeout_ms
        )
    elif filename.endswith(".py"):
        try:
            compile(content, filename, "exec")
        except SyntaxError as error:
            raise FunctionLoadError(
                f"syntax error in {filename}, line {error.lineno}, column {error.offset}: "
                f"{error.msg}"
            ) from None
    elif filename.endswith((".zip", ".whl")):
        # refused by its directory now, rather than by every instance as it unpacks it
        await run_in_threadpool(services.functions.admission.check_package, content, filename)
    else:
        raise ApiError(
            400,
            f"the function package {filename!r} must be a .py file, a .zip, a .whl wheel or a "
            ".js script",
        )
    ref = await run_in_threadpool(services.packages.upload, content, filename)
    field, other = ("js", "py") if filename.endswith(".js") else ("py", "js")
    config.pop(other, None)
    config[field] = filename
    return ref.to_json()


def _with_code(config: dict[str, Any]) -> dict[str, Any]:
    """The config with a stand-in for its code file, to check it before the code arrives."""
    javascript = (
        config.get("js")
        or str(config.get("runtime", "")).upper() == "JAVASCRIPT"
        or config.get("urlBindings")  # only JavaScript functions have them
    )
    field = "js" if javascript else "py"
    return {**config, field: config.get(field) or f"function.{field}"}


_CONFIG_PART = Form(alias="functionConfig", description="FunctionConfig JSON")
_DATA_PART = File(
    description="The function's code: a .py file, a .zip, a .whl wheel or a .js script"
)
_URL_PART = Form(
    description="Where to fetch the code instead: http(s)://, or file:// on the worker"
)


@functions_router.post("/{tenant}/{namespace}/{name}", status_code=204)
async def register(
    request: Request,
    tenant: str,
    namespace: str,
    name: str,
    function_config: Annotated[str | None, _CONFIG_PART] = None,
    data: Annotated[UploadFile | None, _DATA_PART] = None,
    url: Annotated[str | None, _URL_PART] = None,
) -> None:
    """Register a function: multipart ``functionConfig`` (JSON) and ``data`` (the code) or
    ``url``."""
    services = _services(request)
    admission = services.functions.admission
    fqfn = f"{tenant}/{namespace}/{name}"
    admission.check_names(tenant, namespace, name)
    config = _config(function_config, tenant, namespace, name)
    await run_in_threadpool(services.tenancy.check_namespace, tenant, namespace)
    if services.metadata.get(fqfn) is not None:
        raise FunctionExistsError(f"Function {name} already exists")
    # refused before the code is read and stored (the leader checks again as it writes)
    parsed = admission.check_config(_with_code(config))
    authorize_topics(request, tenant, parsed)
    services.functions.check_capacity(fqfn, parsed.parallelism)
    code = await _code(services, data, url)
    if code is None:
        raise ApiError(400, "Function Package is not provided")
    package = await _package(services, *code, config)
    admission.check_config(config)
    change = FunctionChange("register", fqfn, config, package, auth_data=caller_auth_data(request))
    await run_in_threadpool(services.functions.submit, change, _credentials(request))


@functions_router.put("/{tenant}/{namespace}/{name}", status_code=204)
async def update(
    request: Request,
    tenant: str,
    namespace: str,
    name: str,
    function_config: Annotated[str | None, _CONFIG_PART] = None,
    data: Annotated[UploadFile | None, _DATA_PART] = None,
    url: Annotated[str | None, _URL_PART] = None,
    update_options: Annotated[str | None, Form(alias="updateOptions")] = None,
) -> None:
    """Update a function: fields given in ``functionConfig`` change as Pulsar's update rules
    allow, with ``data`` or ``url`` its code too. An update that changes nothing is refused
    (400 "Update contains no change"), as in Pulsar."""
    services = _services(request)
    admission = services.functions.admission
    fqfn = f"{tenant}/{namespace}/{name}"
    admission.check_names(tenant, namespace, name)
    requested = _config(function_config, tenant, namespace, name)
    current = _record(services, fqfn, missing_status=400)
    unknown = unknown_fields(requested)
    if unknown:
        raise ApiError(400, f"invalid function config: {', '.join(unknown)}: unknown field")
    config = merge_update(current.config, _unmasked(requested, current.config))
    new_code = data is not None or bool(url)
    updates_auth_data = _updates_auth_data(update_options)
    if not new_code and not updates_auth_data and not changes_anything(current.config, config):
        raise ApiError(400, "Update contains no change")
    parsed = admission.check_config(config)
    authorize_topics(request, tenant, parsed)
    services.functions.check_capacity(fqfn, parsed.parallelism)
    code = await _code(services, data, url)
    package = await _package(services, *code, config) if code is not None else None
    admission.check_config(config)
    # as Pulsar: the caller's credentials replace the function's only when asked to
    renew = updates_auth_data or current.auth_data is None
    auth_data = caller_auth_data(request) if renew else None
    await run_in_threadpool(
        services.functions.submit,
        FunctionChange("update", fqfn, config, package, auth_data=auth_data),
        _credentials(request),
    )


def _updates_auth_data(raw: str | None) -> bool:
    """Whether ``updateOptions`` asks to update the auth data (an update in itself for
    Pulsar)."""
    try:
        options = json.loads(raw) if raw else {}
    except ValueError:
        raise ApiError(400, "updateOptions is not valid JSON") from None
    return isinstance(options, dict) and options.get("updateAuthData") is True


@functions_router.delete("/{tenant}/{namespace}/{name}", status_code=204)
def delete(
    request: Request,
    tenant: str,
    namespace: str,
    name: str,
    keep_state: Annotated[bool, Query(alias="keepState")] = False,
) -> None:
    """Delete a function, and its state unless ``keepState=true``."""
    services = _services(request)
    fqfn = f"{tenant}/{namespace}/{name}"
    _record(services, fqfn)
    services.functions.submit(FunctionChange("delete", fqfn), _credentials(request))
    if not keep_state:
        delete_function_state(services, fqfn)


@functions_router.get("/{tenant}/{namespace}/{name}")
def get(request: Request, tenant: str, namespace: str, name: str) -> dict[str, Any]:
    """The FunctionConfig Pulsar's worker answers (its defaults filled in), then the fields
    as sent that Pulsar's answer leaves out; each secret's value shown as ``******``."""
    record = _record(_services(request), f"{tenant}/{namespace}/{name}")
    config = pulsar_function_config(record.config)
    if isinstance(config.get("secrets"), dict):
        config["secrets"] = dict.fromkeys(config["secrets"], SECRET_MASK)
    return config


def _unmasked(requested: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """``requested`` with each secret given as SECRET_MASK set back to its current value
    (a config read with ``get`` and sent back keeps its secrets)."""
    secrets, kept = requested.get("secrets"), current.get("secrets")
    if not isinstance(secrets, dict) or not isinstance(kept, dict):
        return requested
    restored = {
        name: kept[name] if value == SECRET_MASK and name in kept else value
        for name, value in secrets.items()
    }
    return {**requested, "secrets": restored}


@functions_router.get("/builtins")
def builtins() -> list[dict[str, Any]]:
    """Pulsar's built-in functions (``functions available-functions``): Magnetar ships
    none, so the list is empty (its examples/ are code to upload, not built-ins)."""
    return []


@functions_router.get("/{tenant}/{namespace}")
def list_functions(request: Request, tenant: str, namespace: str) -> list[str]:
    prefix = f"{tenant}/{namespace}/"
    return sorted(
        fqfn.removeprefix(prefix)
        for fqfn in _services(request).metadata.functions()
        if fqfn.startswith(prefix)
    )
