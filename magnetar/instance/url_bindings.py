"""URL bindings: the HTTP endpoints a JavaScript function may reach with ``curl()``, after
Couchbase Eventing's URL aliases.

The function's author declares them in its config (``urlBindings``): an alias, a base URL,
the authentication and a time limit; where they may point is the worker operator's rule
(``url_binding_hosts``, see ``magnetar.instance.url_hosts``). Credentials are never in the
config itself (a tenant's users read it, and the status shows it): ``auth.secret`` names one
of the function's ``secrets``, whose value the secrets provider gives the instance. A request
reaches only URLs under its binding's base URL: same scheme, host and port, a path under
the base path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_URL_TIMEOUT_MS",
    "UrlAuth",
    "UrlAuthType",
    "UrlBinding",
    "UrlOutsideBindingError",
    "check_url_bindings",
    "request_url",
    "under_binding",
]

DEFAULT_URL_TIMEOUT_MS = 10_000
"""Time limit of one request of a binding without ``timeoutMs``."""
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""Largest response body of a binding without ``maxResponseBytes``."""
_ALIAS = re.compile(r"[A-Za-z_$][\w$]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"


class UrlAuthType(StrEnum):
    NONE = "none"
    BASIC = "basic"
    BEARER = "bearer"


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, frozen=True, extra="forbid"
    )


class UrlAuth(_Model):
    """How requests of a binding authenticate: ``none``, ``basic`` (``username`` and the
    password in ``secret``) or ``bearer`` (the token in ``secret``)."""

    type: str = UrlAuthType.NONE.value
    username: str | None = None
    """The user of basic authentication (not a secret)."""
    secret: str | None = None
    """Name of the function's secret holding the password or the token."""


class UrlBinding(_Model):
    """One endpoint a JavaScript function may call (``urlBindings`` entry)."""

    alias: str
    """The name handlers pass to ``curl()`` (also a global variable of the script)."""
    url: str
    """Base URL: every request goes to a URL under it."""
    auth: UrlAuth = UrlAuth()
    timeout_ms: int = Field(default=DEFAULT_URL_TIMEOUT_MS, gt=0)
    """Time limit of one request (connect, send, receive); past it the call throws."""
    max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, gt=0)
    """Largest response body; a larger one makes the call throw."""


class UrlOutsideBindingError(ValueError):
    """A request's path or a redirect leaves its binding's base URL."""


def check_url_bindings(bindings: Sequence[UrlBinding], secrets: Mapping[str, Any]) -> None:
    """ValueError saying what is wrong with a function's bindings (bad URL, unknown auth
    type, missing or undeclared secret, duplicate alias)."""
    seen: set[str] = set()
    for index, binding in enumerate(bindings):
        where = f"urlBindings[{index}]"
        if not _ALIAS.fullmatch(binding.alias):
            raise ValueError(
                f"{where}.alias {binding.alias!r} must be a JavaScript identifier (letters, "
                "digits, _ and $, not starting with a digit): handlers use it as a name"
            )
        if binding.alias in seen:
            raise ValueError(f"{where}.alias {binding.alias!r} is declared twice")
        seen.add(binding.alias)
        _check_base_url(binding.url, f"{where}.url")
        _check_auth(binding.auth, secrets, f"{where}.auth")


def _check_base_url(url: str, where: str) -> None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a port that is not a number
    except ValueError as error:
        raise ValueError(f"{where} {url!r} is not a valid URL: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{where} {url!r} must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            f"{where} must not hold credentials (user:password@): put them in one of the "
            "function's secrets and name it in auth"
        )
    if parts.query or parts.fragment or " " in url or _CONTROL.search(url):
        raise ValueError(
            f"{where} {url!r} must be a base URL without query, fragment, spaces or "
            "backslashes (requests add their path and params)"
        )


def _check_auth(auth: UrlAuth, secrets: Mapping[str, Any], where: str) -> None:
    kinds = ", ".join(UrlAuthType)
    if auth.type not in tuple(UrlAuthType):
        raise ValueError(f"{where}.type {auth.type!r} is not supported (supported: {kinds})")
    if auth.type == UrlAuthType.NONE:
        if auth.secret is not None or auth.username is not None:
            raise ValueError(f"{where}: type none takes no username or secret")
        return
    if auth.type == UrlAuthType.BASIC and not auth.username:
        raise ValueError(f"{where}: basic authentication needs a username")
    if auth.type == UrlAuthType.BEARER and auth.username is not None:
        raise ValueError(f"{where}: bearer authentication takes no username")
    if not auth.secret:
        raise ValueError(
            f"{where}: {auth.type} authentication needs secret, the name of one of the "
            "function's secrets (the password or token is never written in the binding)"
        )
    if auth.secret not in secrets:
        declared = ", ".join(sorted(secrets)) or "none"
        raise ValueError(
            f"{where}.secret {auth.secret!r} is not one of the function's secrets "
            f"(declared: {declared}); add it to secrets"
        )


def request_url(base: str, path: str, params: Mapping[str, Any] | None = None) -> str:
    """The URL of a request to ``path`` (relative to ``base``) with query ``params``;
    UrlOutsideBindingError for an absolute URL or a path that leaves the base path."""
    if "://" in path or path.startswith("//") or _CONTROL.search(path) or "#" in path:
        raise UrlOutsideBindingError(
            f"path {path!r} must be relative to the binding's URL (no absolute URL, control "
            "character, backslash or fragment)"
        )
    path, _, query = path.partition("?")
    parts = urlsplit(base)
    segments = _resolve(_segments(parts.path) + _segments(path), path)
    if segments[: len(_segments(parts.path))] != _segments(parts.path):
        raise UrlOutsideBindingError(f"path {path!r} leaves the binding's URL {base}")
    trailing = "/" if path.endswith("/") or (not path and parts.path.endswith("/")) else ""
    url = f"{parts.scheme}://{parts.netloc}/{quote('/'.join(segments), safe=_PATH_SAFE)}"
    url += trailing if segments else ""
    queries = [quote(query, safe=_PATH_SAFE + "?")] if query else []
    if params:
        queries.append(urlencode(_query_pairs(params)))
    return url + ("?" + "&".join(queries) if queries else "")


def under_binding(base: str, url: str) -> bool:
    """Whether ``url`` (a redirect's target) has the base's origin and a path under it."""
    target, origin = urlsplit(url), urlsplit(base)
    if (target.scheme, target.hostname, target.port) != (
        origin.scheme,
        origin.hostname,
        origin.port,
    ):
        return False
    try:
        segments = _resolve(_segments(target.path), target.path)
    except UrlOutsideBindingError:
        return False
    return segments[: len(_segments(origin.path))] == _segments(origin.path)


def _segments(path: str) -> list[str]:
    return [segment for segment in path.split("/") if segment]


def _resolve(segments: list[str], path: str) -> list[str]:
    """Apply ``.`` and ``..``; refuse encoded ones and encoded slashes, which a server may
    decode after our check."""
    resolved: list[str] = []
    for segment in segments:
        decoded = unquote(segment)
        if decoded != segment and (decoded in (".", "..") or "/" in decoded or "\\" in decoded):
            raise UrlOutsideBindingError(
                f"path {path!r} hides a dot segment or a slash in percent-encoding"
            )
        if segment == "..":
            if not resolved:
                raise UrlOutsideBindingError(f"path {path!r} climbs above the host's root")
            resolved.pop()
        elif segment != ".":
            resolved.append(segment)
    return resolved


def _query_pairs(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    pairs = []
    for name, value in params.items():
        for item in value if isinstance(value, list) else [value]:
            text = ("true" if item else "false") if isinstance(item, bool) else str(item)
            pairs.append((str(name), text))
    return pairs
