"""WorkerConfig: typed, frozen settings of one worker, from a YAML file, the environment
(``MAGNETAR_*``) and flags, in increasing precedence."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from magnetar.client import Connection
from magnetar.instance.url_hosts import UrlHostRule
from magnetar.worker.exceptions import WorkerConfigError
from magnetar.worker.isolation import parse_uid_range

__all__ = ["SECRET_SETTINGS", "WorkerConfig", "load_worker_config", "take_secret_environment"]


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
    system_namespace: str = "public/magnetar"
    """Namespace of the system topics: Magnetar's own, so that an Apache Pulsar functions
    worker on the same cluster (whose topics are ``public/functions/metadata`` and so on)
    and Magnetar never read each other's records. A cluster that ran with the former
    default keeps its functions with ``system_namespace: public/functions``."""
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
    broker_client_authentication_plugin: str | None = None
    """How the worker authenticates to the broker (its binary protocol and its admin API), by
    Pulsar's client plugin class name, as Pulsar's ``brokerClientAuthenticationPlugin``:
    ``org.apache.pulsar.client.impl.auth.AuthenticationToken`` on a broker with token
    authentication. The worker's role must be a superuser of the broker (it reads and
    writes the system namespace and grants functions their state topics). Instances of the
    process runtime never use it: they connect with their function's credentials (those of
    the thread runtime share the worker's client)."""
    broker_client_authentication_parameters: str | None = None
    """The plugin's parameters (``token:<jwt>``, ``file:///path/to/token``), as Pulsar's
    ``brokerClientAuthenticationParameters``."""
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
    that an assigned instance only has to subscribe (0: each starts from scratch). With
    authentication on they start without connecting: an instance connects with its
    function's credentials."""
    instance_isolation: bool = True
    """When the worker runs as root: run each instance process as an unprivileged user of its
    own (a uid of ``instance_uids``) in a directory of its own (see
    ``magnetar.worker.isolation``). Needs the process runtime. No effect otherwise."""
    instance_cpu_limits: bool = True
    """Hold each instance process to its function's ``resources.cpu`` cores (default 1) with
    a cgroup CPU quota (see ``magnetar.worker.cpu_limits``); needs the process runtime and
    root or a delegated cgroup, and without them the worker logs that CPU is not limited."""
    instance_memory_limits: bool = True
    """Count the memory of what each instance process starts, and of its own ``/tmp``,
    against its ``resources.ram``, and have the kernel hold it there: a memory cgroup (see
    ``magnetar.worker.memory_limits``); needs the process runtime and root or a delegated
    cgroup, and without them the worker logs that it is not done."""
    instance_max_files: int = Field(default=100_000, ge=100)
    """Files and folders an isolated instance's directory may hold (with its
    ``resources.disk`` bytes, measured every 10 s or so: see
    ``magnetar.worker.disk_limits``); over either, the instance is stopped."""
    instance_max_tasks: int = Field(default=1024, ge=16)
    """Processes and threads an isolated instance (its uid) may have at once, user code's
    included: a fork bomb stops there instead of exhausting the host's."""
    instance_network_limits: bool = True
    """When instances are isolated: hold what they reach on the network by their uids, in
    the kernel (nftables; see ``magnetar.worker.instance_network``): this host only on the
    broker's ports, DNS and ``instance_host_ports``, no link-local address (the cloud's
    metadata service), and no connection accepted. Without ``nft`` the worker logs that they
    are not held."""
    instance_host_ports: tuple[Annotated[int, Field(ge=1, le=65535)], ...] = ()
    """Ports of this host that isolated instances may reach besides the broker's and DNS (a
    local agent's, say); comma-separated in the environment."""
    instance_uids: str = "400000-465535"
    """``FIRST-LAST``: the uids (gids alike) isolated instances run as, one per running
    instance on the host; none needs a passwd entry."""
    instance_dir: Path | None = None
    """Where isolated instances get their directories; every directory above it must be
    searchable by others (o+x), or the instance takes a mount namespace to reach it. Default:
    ``<temp dir>/magnetar-instances/<worker_id>-<hash of data_dir>``."""
    restart_backoff_initial_s: float = Field(default=0.5, gt=0)
    """First delay before restarting a crashed instance."""
    restart_backoff_max_s: float = Field(default=30.0, gt=0)
    """Longest delay between restarts of a crashing instance."""
    instance_ram_bytes: int | None = Field(default=1024 * 1024 * 1024, gt=0)
    """Memory limit of an instance (process runtime) whose function sets no ``resources.ram``:
    an instance resident beyond its limit is killed and its status says so; None: no limit."""
    instance_log_max_bytes: int = Field(default=10 * 1024 * 1024, gt=0)
    """Size at which an instance's log file (``<data_dir>/logs/functions/<tenant>/<namespace>/
    <name>/<name>-<instanceId>.log``: its stdout, stderr and logging) rolls over."""
    instance_log_backups: int = Field(default=2, ge=0)
    """Rolled-over log files kept per instance (``.log.1``, ``.log.2``, ...)."""
    instance_stop_timeout_s: float = Field(default=10.0, gt=0)
    """How long an instance that is deleted, moved or restarted may drain (finish its in-flight
    messages) before it is killed; its unacknowledged inputs are then redelivered."""
    shutdown_timeout_s: float = Field(default=5.0, gt=0)
    """On Ctrl-C or SIGTERM, how long the instances may drain before they are killed: the worker
    exits within a few seconds more, whatever user code does."""
    busy_warning_s: float = Field(default=5.0, gt=0)
    """An instance whose user code has had one message this long says so in its status
    (``message <id> from <topic> in user code for 42 s``)."""
    request_timeout_s: float = Field(default=10.0, gt=0)
    """How long a REST call waits for the cluster (leader, replication, a trigger's output)."""
    max_package_bytes: int = Field(default=100 * 1024 * 1024, gt=0)
    """Largest function package accepted; a request body may be 1 MiB more."""
    max_package_unpacked_bytes: int = Field(default=1 << 30, gt=0)
    """Most bytes a .zip or .whl package may unpack to: refused at registration by its
    directory, and stopped while unpacking by what it actually inflates to."""
    max_package_entries: int = Field(default=20_000, gt=0)
    """Most entries (files and folders) in a .zip or .whl package."""
    max_package_compression_ratio: float = Field(default=100.0, gt=1)
    """Most a package, or an entry of it past 1 MiB, may inflate relative to its compressed
    size (a zip bomb inflates a thousandfold and more)."""
    max_parallelism: int = Field(default=100, ge=1)
    """Most instances one function may have (its ``parallelism``)."""
    max_instances_per_worker: int = Field(default=100, ge=1)
    """Instances the cluster may hold per live worker: a register or update that would take
    the functions' parallelism together past this times the live workers is refused."""
    max_instances_per_tenant: int = Field(default=100, ge=1)
    """Instances the functions of one tenant may hold together: a register or update that
    would take its functions' parallelism past this is refused, so that no tenant fills the
    cluster the others share."""
    url_binding_hosts: tuple[str, ...] = ("public",)
    """Where JavaScript functions' URL bindings (``curl()``) may point, which their authors
    declare: ``public`` (any host whose address is public), host names (``api.example.com``),
    ``*.example.com`` (the names under it), IP addresses and ranges (``10.0.0.0/8``,
    ``fd00::/8``), ``*`` (anything); comma-separated in the environment. Loopback,
    link-local (the cloud's metadata service), private and other special-purpose addresses
    are refused unless a listed range holds them; a listed name may resolve to any address.
    Checked at create and update, and by the instance against the address each name
    resolves to (see ``magnetar.instance.url_hosts``)."""
    max_name_length: int = Field(default=64, ge=1)
    """Longest tenant, namespace or function name a function is registered with (names end
    up in file and topic names)."""
    console_enabled: bool = True
    """Serve the web console at ``/console/`` on the REST API's port (a page that calls the
    public REST API only, with the same authentication)."""
    authentication_enabled: bool = False
    """Require a bearer token (JWT) on the admin API; see ``magnetar.worker.auth``."""
    token_secret_key: str | None = None
    """Secret key of HS256 tokens: file:///path, data:;base64,<key>, a path or base64."""
    token_public_key: str | None = None
    """Public key of RS256/ES256 tokens (PEM or DER), given like ``token_secret_key``."""
    cluster_key: str | None = None
    """The key the workers of a cluster share, given like ``token_secret_key`` (at least 32
    bytes: ``magnetar tokens create-secret-key``): it seals every record they write to the
    system topics and every call between them (``magnetar.worker.cluster_key``), so that no
    other client of the broker, and no tenant's token, passes for a worker. Required with
    ``authentication_enabled``; without it and without authentication, records and calls
    go unsealed (a warning says so). Every worker of the cluster needs the same key, and
    the key must stay the same: records sealed with another are dropped."""
    accept_unsealed_history: bool = False
    """Upgrading a cluster that ran without a cluster key (or a version without seals):
    accept the unsealed records at the start of each system topic, up to its first sealed
    one (the first leader with the key writes one as it takes over). Turn it off once the
    cluster has run with the key: while on, a forger who reaches an empty topic first
    (a cluster's first start) gets its records accepted."""
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

    @field_validator("url_binding_hosts", "instance_host_ports", mode="before")
    @classmethod
    def _split_hosts(cls, value: Any) -> Any:
        return (
            [h.strip() for h in value.split(",") if h.strip()] if isinstance(value, str) else value
        )

    @field_validator("url_binding_hosts")
    @classmethod
    def _check_hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        UrlHostRule(value)  # ValueError naming the entry that is none of the kinds
        return value

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

    @field_validator("instance_uids")
    @classmethod
    def _check_instance_uids(cls, value: str) -> str:
        parse_uid_range(value)
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
        if self.authentication_enabled and not self.cluster_key:
            raise ValueError(
                "authentication_enabled needs cluster_key, the key every worker of the cluster "
                "shares (create one with `magnetar tokens create-secret-key --output "
                "cluster.key` and give every worker cluster_key: file:///path/to/cluster.key)"
            )
        return self

    @property
    def broker_connection(self) -> Connection | None:
        """The worker's own credentials for the broker; None without any."""
        if not self.broker_client_authentication_plugin:
            return None
        return Connection(
            self.broker_client_authentication_plugin,
            self.broker_client_authentication_parameters,
        )

    @property
    def instance_log_dir(self) -> Path:
        """Where the instances' log files are (``functions/<tenant>/...`` under it)."""
        return self.data_dir / "logs"

    def system_topic(self, name: str) -> str:
        return f"persistent://{self.system_namespace}/{name}"

    @property
    def admin_url(self) -> str:
        return self.advertised_url or f"http://{self.http_host}:{self.http_port}"


_ENV_PREFIX = "MAGNETAR_"
SECRET_SETTINGS = ("cluster_key", "token_secret_key", "broker_client_authentication_parameters")
"""Settings that give a worker's powers to whoever reads them."""


def take_secret_environment() -> dict[str, str]:
    """Remove the secret settings (``SECRET_SETTINGS``) from this process's environment and
    return them by field name: instances are child processes, and inherit the rest."""
    taken = {}
    for field in SECRET_SETTINGS:
        value = os.environ.pop(_ENV_PREFIX + field.upper(), None)
        if value is not None:
            taken[field] = value
    return taken


def load_worker_config(
    path: Path | None = None, defaults: dict[str, Any] | None = None, **flags: Any
) -> WorkerConfig:
    """The config from ``defaults``, then ``path`` (YAML), then ``MAGNETAR_<FIELD>``
    variables, then ``flags`` (None values are ignored)."""
    data: dict[str, Any] = dict(defaults or {})
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
