"""WorkerConfig: typed, frozen settings of one worker, from a YAML file, the environment
(``MAGNETAR_*``) and flags, in increasing precedence."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from magnetar.worker.exceptions import WorkerConfigError

__all__ = ["WorkerConfig", "load_worker_config"]


class WorkerConfig(BaseModel):
    """Settings of one worker."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    worker_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    """Unique id of the worker in its cluster."""
    broker_url: str = "pulsar://127.0.0.1:6650"
    """Pulsar service URL."""
    http_host: str = "127.0.0.1"
    """Address the REST admin API listens on."""
    http_port: int = Field(default=8080, ge=0, le=65535)
    """Port of the REST admin API."""
    advertised_url: str | None = None
    """URL other workers use to reach this one; http://http_host:http_port by default."""
    data_dir: Path = Path(".magnetar/worker")
    """Package cache and instance work files."""
    system_namespace: str = "public/functions"
    """Namespace of the system topics."""
    metadata_topic: str = "metadata"
    """Function metadata topic (the replicated state machine)."""
    coordination_topic: str = "coordinate"
    """Membership heartbeats; its Failover subscription elects the leader."""
    assignments_topic: str = "assignments"
    """Where the leader publishes the assignment of instances to workers."""
    packages_topic: str = "packages"
    """Function code packages, content-addressed."""
    pulsar_functions_cluster: str = "standalone"
    """The cluster name tenants are allowed on when the worker keeps tenants and namespaces
    itself (without ``pulsar_admin_url``), as Pulsar's ``pulsarFunctionsCluster``."""
    pulsar_admin_url: str | None = None
    """HTTP admin URL of an Apache Pulsar broker (``http://broker:8080``). When set, the worker
    creates the system namespace with retention, sets compaction on the system topics and turns
    on deduplication for EFFECTIVELY_ONCE outputs (``magnetar.worker.broker_policies``), and
    its tenants and namespaces are the ones functions live in (``broker_tenancy``); unset (the
    embedded broker has no admin API), nothing is asked of the broker and the workers keep
    tenants and namespaces in the metadata topic (``tenancy``)."""
    heartbeat_interval_s: float = Field(default=0.5, gt=0)
    """How often the worker announces itself."""
    liveness_timeout_s: float = Field(default=3.0, gt=0)
    """A worker not heard from for this long is removed and its instances moved."""
    scheduler: Literal["least-loaded-sticky", "round-robin"] = "least-loaded-sticky"
    """How instances are placed on workers."""
    runtime: Literal["process", "thread"] = "process"
    """One OS process per instance, or threads inside the worker."""
    warm_instances: int = Field(default=2, ge=0)
    """Instance processes the process runtime keeps started and connected to the broker, so
    that an assigned instance only has to subscribe (0: each starts from scratch)."""
    restart_backoff_initial_s: float = Field(default=0.5, gt=0)
    """First delay before restarting a crashed instance."""
    restart_backoff_max_s: float = Field(default=30.0, gt=0)
    """Longest delay between restarts of a crashing instance."""
    request_timeout_s: float = Field(default=10.0, gt=0)
    """How long a REST call waits for the cluster (leader, replication, a trigger's output)."""
    max_package_bytes: int = Field(default=100 * 1024 * 1024, gt=0)
    """Largest function package accepted; a request body may be 1 MiB more."""
    console_enabled: bool = True
    """Serve the web console at ``/console/`` on the REST API's port (a page that calls the
    public REST API only, with the same authentication)."""
    authentication_enabled: bool = False
    """Require a bearer token (JWT) on the admin API; see ``magnetar.worker.auth``."""
    token_secret_key: str | None = None
    """Secret key of HS256 tokens: file:///path, data:;base64,<key>, a path or base64."""
    token_public_key: str | None = None
    """Public key of RS256/ES256 tokens (PEM or DER), given like ``token_secret_key``."""
    token_auth_claim: str = "sub"
    """The token claim that names the caller's role."""
    superuser_roles: tuple[str, ...] = ()
    """Roles that may do everything (comma-separated in the environment)."""
    tenant_admin_roles: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    """Tenant -> roles that may manage its functions (JSON in the environment)."""

    @field_validator("superuser_roles", mode="before")
    @classmethod
    def _split_roles(cls, value: Any) -> Any:
        return (
            [r.strip() for r in value.split(",") if r.strip()] if isinstance(value, str) else value
        )

    @field_validator("tenant_admin_roles", mode="before")
    @classmethod
    def _parse_tenant_roles(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f'must be JSON such as {{"acme": ["acme-admin"]}}: {error}'
                ) from None
        return value

    @field_validator("pulsar_admin_url")
    @classmethod
    def _check_pulsar_admin_url(cls, value: str | None) -> str | None:
        if not value:
            return None  # an empty MAGNETAR_PULSAR_ADMIN_URL means "no admin API"
        if not value.startswith(("http://", "https://")):
            raise ValueError(
                f"must be the broker's HTTP admin URL, such as http://broker:8080, got {value!r}"
            )
        return value.rstrip("/")

    @model_validator(mode="after")
    def _check_auth(self) -> WorkerConfig:
        if self.authentication_enabled and (self.token_secret_key is None) == (
            self.token_public_key is None
        ):
            raise ValueError(
                "authentication_enabled needs exactly one of token_secret_key and token_public_key"
            )
        return self

    def system_topic(self, name: str) -> str:
        return f"persistent://{self.system_namespace}/{name}"

    @property
    def admin_url(self) -> str:
        return self.advertised_url or f"http://{self.http_host}:{self.http_port}"


_ENV_PREFIX = "MAGNETAR_"


def load_worker_config(path: Path | None = None, **flags: Any) -> WorkerConfig:
    """The config from ``path`` (YAML), then ``MAGNETAR_<FIELD>`` variables, then ``flags``
    (None values are ignored)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise WorkerConfigError(f"cannot read worker config {path}: {error}") from None
        if not isinstance(loaded, dict):
            raise WorkerConfigError(f"worker config {path} must be a mapping")
        data.update({key.replace("-", "_"): value for key, value in loaded.items()})
    for field in WorkerConfig.model_fields:
        value = os.environ.get(_ENV_PREFIX + field.upper())
        if value is not None:
            data[field] = value
    data.update({key: value for key, value in flags.items() if value is not None})
    try:
        return WorkerConfig.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in item['loc'])}: {item['msg']}" for item in error.errors()
        )
        raise WorkerConfigError(f"invalid worker config: {problems}") from None
