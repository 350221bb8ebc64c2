"""Apache Pulsar's package management: named, versioned packages
(``function://tenant/namespace/name@version``) with their metadata.

A package's content is stored like function code (the packages topic, content-addressed, see
``packages``); its name, metadata and content reference are an entry of kind ``package`` in
the metadata topic, written by the leader like tenants and namespaces, so every worker lists
and serves every package. The refusals are Pulsar's PackagesManagementImpl's (404 for what
does not exist, 409 for a version uploaded twice).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Literal, get_args

import httpx

from magnetar.worker.assignments import AssignmentManager
from magnetar.worker.cluster_key import PeerSeal
from magnetar.worker.exceptions import (
    AlreadyExistsError,
    PreconditionFailedError,
    RequestRefusedError,
)
from magnetar.worker.leader import LeaderService
from magnetar.worker.leader_channel import LeaderChannel
from magnetar.worker.metadata import Entry, MetadataManager
from magnetar.worker.packages import PackageRef

__all__ = [
    "FORWARD_PATH",
    "PACKAGE_TYPES",
    "PackageChange",
    "PackageName",
    "PackageNotFoundError",
    "PackageRegistry",
]

FORWARD_PATH = "/admin/v2/worker/internal/package-changes"
PACKAGE_TYPES = ("function", "source", "sink")
_KIND = "package"
_PART = re.compile(r"[-=:.\w]+")
_URL = re.compile(
    r"(?P<type>\w+)://(?P<tenant>[^/@]+)/(?P<namespace>[^/@]+)/(?P<name>[^/@]+)(@(?P<version>[^/@]+))?"
)

_FILE_KIND = "package-file"
"""Files ``functions upload --path`` stored, by path (Pulsar keeps them at that path)."""

PackageOp = Literal["upload", "update_metadata", "delete", "put_file"]


class PackageNotFoundError(RequestRefusedError):
    """The package (or that version of it) does not exist (404)."""

    status_code = 404


@dataclass(frozen=True)
class PackageName:
    """``{type}://{tenant}/{namespace}/{name}@{version}`` (Pulsar's PackageName)."""

    type: str
    tenant: str
    namespace: str
    name: str
    version: str = "latest"

    def __post_init__(self) -> None:
        if self.type not in PACKAGE_TYPES:
            raise PreconditionFailedError(
                f"Invalid package type '{self.type}': it must be one of {', '.join(PACKAGE_TYPES)}"
            )
        for part in (self.tenant, self.namespace, self.name, self.version):
            if not _PART.fullmatch(part):
                raise PreconditionFailedError(f"Invalid package name part '{part}'")

    @classmethod
    def parse(cls, url: str) -> PackageName:
        """A package URL as ``pulsar-admin packages`` and ``--py function://...`` give it."""
        found = _URL.fullmatch(url)
        if found is None:
            raise PreconditionFailedError(
                f"Invalid package name '{url}': expected type://tenant/namespace/name@version"
            )
        return cls(
            found["type"],
            found["tenant"],
            found["namespace"],
            found["name"],
            found["version"] or "latest",
        )

    @property
    def key(self) -> str:
        """The metadata entry's key."""
        return f"{self.type}/{self.tenant}/{self.namespace}/{self.name}/{self.version}"

    def __str__(self) -> str:
        return f"{self.type}://{self.tenant}/{self.namespace}/{self.name}@{self.version}"


@dataclass(frozen=True)
class PackageChange:
    """One change to one package version, as sent to the leader."""

    op: PackageOp
    name: PackageName | str
    """The package; for put_file, the file's path."""
    value: Entry | None = None
    """For upload: the package reference and metadata; for update_metadata: the metadata;
    for put_file: the reference."""

    @property
    def kind(self) -> str:
        return _FILE_KIND if self.op == "put_file" else _KIND

    @property
    def key(self) -> str:
        return self.name.key if isinstance(self.name, PackageName) else self.name

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "name": str(self.name), "value": self.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PackageChange:
        op = data["op"]
        if op not in get_args(PackageOp):
            raise KeyError(f"unknown operation {op!r}")
        value = data.get("value")
        name = str(data["name"]) if op == "put_file" else PackageName.parse(str(data["name"]))
        return cls(op, name, value if isinstance(value, dict) else None)


def package_metadata(value: Any) -> dict[str, Any]:
    """Pulsar's PackageMetadata from what a caller sent: description, contact, properties
    (the times are the registry's)."""
    data = value if isinstance(value, dict) else {}
    properties = data.get("properties") or {}
    if not isinstance(properties, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in properties.items()
    ):
        raise RequestRefusedError("package metadata properties must map names to strings")
    return {
        "description": str(data.get("description") or ""),
        "contact": str(data.get("contact") or ""),
        "properties": dict(properties),
    }


class PackageRegistry:
    """Named packages in the metadata topic, changed through the leader."""

    def __init__(
        self,
        metadata: MetadataManager,
        assignments: AssignmentManager,
        leader: LeaderService,
        timeout_s: float,
        http: httpx.Client,
        peer_seal: PeerSeal | None = None,
    ) -> None:
        """``peer_seal``: proves the changes it forwards to the leader a worker's."""
        self._metadata = metadata
        self._leader = leader
        self._timeout = timeout_s
        self._channel = LeaderChannel(
            metadata, assignments, leader.worker_id, timeout_s, http, peer_seal
        )

    # --- reads (after catching up: what any worker changed before the call) ---------------

    def get(self, name: PackageName) -> Entry:
        """The entry of one version: ``package`` (its reference) and ``metadata``."""
        self._metadata.catch_up(self._timeout)
        entry = self._metadata.entries(_KIND).get(name.key)
        if entry is None:
            raise PackageNotFoundError(f"Package '{name}' metadata does not exist")
        return entry

    def ref(self, name: PackageName) -> PackageRef:
        return PackageRef.from_json(self.get(name)["package"])

    def versions(self, name: PackageName) -> list[str]:
        self._metadata.catch_up(self._timeout)
        prefix = name.key.rsplit("/", 1)[0] + "/"
        found = sorted(
            key.removeprefix(prefix)
            for key in self._metadata.entries(_KIND)
            if key.startswith(prefix)
        )
        if not found:
            base = str(name).rsplit("@", 1)[0]
            raise PackageNotFoundError(f"Package '{base}' does not exist")
        return found

    def packages(self, type_: str, tenant: str, namespace: str) -> list[str]:
        """The packages of a type in a namespace, as ``type://tenant/namespace/name``."""
        PackageName(type_, tenant, namespace, "any")
        self._metadata.catch_up(self._timeout)
        prefix = f"{type_}/{tenant}/{namespace}/"
        names = {
            key.removeprefix(prefix).split("/", 1)[0]
            for key in self._metadata.entries(_KIND)
            if key.startswith(prefix)
        }
        return [f"{type_}://{tenant}/{namespace}/{n}" for n in sorted(names)]

    # --- writes ------------------------------------------------------------------------

    def upload(
        self, name: PackageName, ref: PackageRef, metadata: Any, authorization: str | None
    ) -> None:
        value = {"package": ref.to_json(), "metadata": package_metadata(metadata)}
        self._submit(PackageChange("upload", name, value), authorization)

    def update_metadata(self, name: PackageName, metadata: Any, authorization: str | None) -> None:
        change = PackageChange("update_metadata", name, {"metadata": package_metadata(metadata)})
        self._submit(change, authorization)

    def delete(self, name: PackageName, authorization: str | None) -> None:
        self._submit(PackageChange("delete", name), authorization)

    def put_file(self, path: str, ref: PackageRef, authorization: str | None) -> None:
        """Keep a file at ``path`` (``functions upload``); one there already is replaced."""
        self._submit(PackageChange("put_file", path, {"package": ref.to_json()}), authorization)

    def file(self, path: str) -> PackageRef:
        """The file ``functions upload`` stored at ``path``."""
        self._metadata.catch_up(self._timeout)
        entry = self._metadata.entries(_FILE_KIND).get(path)
        if entry is None:
            raise PackageNotFoundError(f"Function package {path} does not exist")
        return PackageRef.from_json(entry["package"])

    def apply_forwarded(self, change: PackageChange) -> int:
        """On the leader: apply a change another worker forwarded; the new version."""
        self._write(change)
        return self._metadata.version_of(self._metadata.entry_key(change.kind, change.key))

    def _submit(self, change: PackageChange, authorization: str | None) -> None:
        self._channel.submit(
            lambda: self._write(change),
            self._metadata.entry_key(change.kind, change.key),
            FORWARD_PATH,
            change.to_json(),
            authorization,
        )

    def _write(self, change: PackageChange) -> None:
        self._leader.write_entry(change.kind, change.key, lambda current: _decide(change, current))


def _decide(change: PackageChange, current: Entry | None) -> Entry | None:
    """The new entry, or Pulsar's refusal (run on the leader while writes are serialized)."""
    now = int(time.time() * 1000)
    if change.op == "put_file":
        return change.value
    if change.op == "upload":
        if current is not None:
            raise AlreadyExistsError(f"Package '{change.name}' metadata already exists")
        assert change.value is not None
        metadata = {**change.value["metadata"], "createTime": now, "modificationTime": now}
        return {"package": change.value["package"], "metadata": metadata}
    if current is None:
        raise PackageNotFoundError(f"Package '{change.name}' metadata does not exist")
    if change.op == "delete":
        return None
    assert change.value is not None
    metadata = {
        **change.value["metadata"],
        "createTime": current["metadata"].get("createTime", now),
        "modificationTime": now,
    }
    return {**current, "metadata": metadata}
