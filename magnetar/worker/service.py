"""The worker service: the composition root that builds the managers and wires them.

Nothing imports this module but the CLI; every manager receives what it needs here.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import uvicorn

from magnetar.client import create_client
from magnetar.instance.landlock import scopes_unavailable
from magnetar.instance.syscall_filter import filter_unavailable
from magnetar.statestore import StateQueryService
from magnetar.worker.admission import Admission, AdmissionLimits
from magnetar.worker.assignments import AssignmentManager
from magnetar.worker.auth import AdminAuth, RoleAuthorizer, TokenAuthenticator, read_key
from magnetar.worker.broker_policies import (
    BrokerPolicies,
    BrokerPreparedRuntime,
    broker_policies,
)
from magnetar.worker.broker_tenancy import BrokerTenancy
from magnetar.worker.cluster_key import ClusterKey, PeerSeal, RecordSeal
from magnetar.worker.config import WorkerConfig
from magnetar.worker.cpu_limits import open_cpu_limits
from magnetar.worker.disk_limits import DiskWatch
from magnetar.worker.function_auth import FunctionAccess, TokenSeal
from magnetar.worker.functions import FunctionManager
from magnetar.worker.instance_network import limit_instance_network
from magnetar.worker.isolation import (
    InstanceIsolation,
    parse_uid_range,
    readable_by_others,
    secure_directory,
)
from magnetar.worker.leader import LeaderService
from magnetar.worker.membership import Membership
from magnetar.worker.memory_limits import open_memory_limits
from magnetar.worker.metadata import MetadataManager
from magnetar.worker.model import WorkerInfo, WorkerReport, instance_key
from magnetar.worker.package_registry import PackageRegistry
from magnetar.worker.packages import PackageStore
from magnetar.worker.reconciler import InstanceReconciler
from magnetar.worker.rest import RestServices, create_app
from magnetar.worker.runtime import InstanceLogs, StateLayout, make_runtime
from magnetar.worker.runtime_manager import BackoffPolicy, RuntimeManager
from magnetar.worker.scheduler import make_scheduler
from magnetar.worker.script_check import ScriptChecker
from magnetar.worker.system_topics import check_system_topics
from magnetar.worker.tenancy import Tenancy, TenancyManager, default_entries
from magnetar.worker.trigger import FunctionTrigger

__all__ = ["WorkerService"]

log = logging.getLogger(__name__)

_KILL_GRACE_S = 3.0
"""Beyond the shutdown timeout: for the instances' kills and the REST server to end."""


class WorkerService:
    """One Magnetar worker: control plane, runtime and REST API, with one lifecycle."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self._stopped = threading.Event()
        self._server: uvicorn.Server | None = None
        self._http_thread: threading.Thread | None = None
        self._policies: BrokerPolicies | None = None
        self.isolation: InstanceIsolation | None = None

    def start(self) -> WorkerService:
        """Start every component; returns once the REST API is listening."""
        config = self.config
        me = WorkerInfo(config.worker_id, config.admin_url)
        admission = Admission(AdmissionLimits.of(config))
        cluster_key = _cluster_key(config)
        record_seal = RecordSeal(cluster_key, config.accept_unsealed_history)
        peer_seal = PeerSeal(cluster_key, config.worker_id)
        token_seal = TokenSeal(cluster_key) if cluster_key is not None else None
        # With a broker admin API: the system namespace and its policies, before anything reads
        # it; the broker's tenants and namespaces are then the ones functions live in.
        self._policies = broker_policies(config)
        if self._policies is not None:
            self._policies.prepare_system_namespace(config)
        client = self._client = create_client(
            config.broker_url, connection=config.broker_connection, log_to_python=True
        )
        try:
            check_system_topics(
                client,
                config.system_topic(config.metadata_topic),
                config.system_topic(config.assignments_topic),
            )
        except Exception:  # a worker that cannot start leaves nothing open
            client.close()
            if self._policies is not None:
                self._policies.close()
            raise
        # Instances on threads get a client of their own: a client logging to Python costs
        # every message a trip into the interpreter (see magnetar.client).
        if config.runtime == "thread" and config.broker_connection is not None:
            log.warning(
                "runtime 'thread' runs functions on a broker client with the worker's own "
                "credentials: on a broker with authorization they may do whatever the worker "
                "may (use the process runtime for code you do not trust)"
            )
        self._data_client = (
            create_client(config.broker_url, connection=config.broker_connection)
            if config.runtime == "thread"
            else None
        )
        # the package cache and state of every tenant: for the worker's user alone
        secure_directory(config.data_dir)
        self.packages = PackageStore(
            client, config.system_topic(config.packages_topic), config.data_dir / "packages"
        )
        self.metadata = MetadataManager(
            client,
            config.system_topic(config.metadata_topic),
            on_change=self._on_metadata_change,
            entries=default_entries(config.system_namespace, config.pulsar_functions_cluster),
            seal=record_seal,
        )
        self.assignments = AssignmentManager(
            client,
            config.system_topic(config.assignments_topic),
            on_change=lambda record: self.reconciler.notify(),
            seal=record_seal,
        )
        self.membership = Membership(
            client,
            config.system_topic(config.coordination_topic),
            me,
            config.heartbeat_interval_s,
            config.liveness_timeout_s,
            on_leadership=self._on_leadership,
            on_members_changed=self._on_members_changed,
            known_leader=self._known_leader,
            known_workers=self._known_workers,
            report=self._report,
            seal=RecordSeal(cluster_key),  # heartbeats have no history to accept
        )
        self.leader = LeaderService(
            me,
            self.membership,
            self.metadata,
            self.assignments,
            make_scheduler(config.scheduler),
            config.request_timeout_s,
            admission,
        )
        state_root = config.data_dir / "state"
        self.state = StateQueryService(
            client, state_root, config.system_namespace, config.request_timeout_s
        )
        self.isolation = _instance_isolation(config)
        if self.isolation is not None and config.instance_network_limits:
            limit_instance_network(
                parse_uid_range(config.instance_uids), config.broker_url, config.instance_host_ports
            )
        logs = InstanceLogs(
            config.instance_log_dir,
            config.instance_log_max_bytes,
            config.instance_log_backups,
            self.isolation,
        )
        runtime = make_runtime(
            config.runtime,
            broker_url=config.broker_url,
            worker_id=config.worker_id,
            client=self._data_client,
            state=StateLayout(state_root, config.system_namespace),
            warm=config.warm_instances,
            archive_limits=admission.limits.archive,
            url_hosts=admission.limits.url_hosts,
            ram_bytes=config.instance_ram_bytes,
            logs=logs,
            isolation=self.isolation,
            # an instance connects with its function's credentials, not before it has them
            preconnect=not config.authentication_enabled,
            cpu_limits=(
                open_cpu_limits()
                if config.instance_cpu_limits and config.runtime == "process"
                else None
            ),
            memory_limits=(
                open_memory_limits()
                if config.instance_memory_limits and config.runtime == "process"
                else None
            ),
            disk_watch=DiskWatch(config.instance_max_files) if self.isolation else None,
        )
        if self._policies is not None:
            runtime = BrokerPreparedRuntime(runtime, self._policies, config.system_namespace)
        self.runtime = RuntimeManager(
            runtime,
            config.worker_id,
            BackoffPolicy(
                initial_s=config.restart_backoff_initial_s, max_s=config.restart_backoff_max_s
            ),
            stop_timeout_s=config.instance_stop_timeout_s,
            busy_warning_s=config.busy_warning_s,
        )
        access = FunctionAccess(
            config.authentication_enabled,
            config.superuser_roles,
            config.system_namespace,
            token_seal,
        )
        self.reconciler = InstanceReconciler(
            config.worker_id, self.metadata, self.assignments, self.packages, self.runtime, access
        )
        # One client for every call to another worker: a new one per call would cost tens of
        # milliseconds (TLS settings) on the paths users wait on (status, forwarded changes).
        # Idle connections are dropped before the server's keep-alive (5 s) would end them.
        http = self._http = httpx.Client(
            timeout=config.request_timeout_s, limits=httpx.Limits(keepalive_expiry=2.0)
        )
        tenancy: Tenancy
        if self._policies is not None:
            tenancy = BrokerTenancy(self._policies.admin)
        else:
            tenancy = TenancyManager(
                self.metadata,
                self.assignments,
                self.leader,
                config.pulsar_functions_cluster,
                config.system_namespace,
                config.request_timeout_s,
                http,
                peer_seal,
            )
        self.functions = FunctionManager(
            self.metadata,
            self.assignments,
            self.leader,
            config.request_timeout_s,
            http,
            # checked on the leader as it writes, unless the broker keeps the namespaces
            namespace_check=None if self._policies is not None else tenancy.check_namespace,
            admission=admission,
            peer_seal=peer_seal,
        )
        services = RestServices(
            config=config,
            metadata=self.metadata,
            assignments=self.assignments,
            membership=self.membership,
            leader=self.leader,
            functions=self.functions,
            packages=self.packages,
            instances=self.runtime,
            trigger=FunctionTrigger(client),
            tenancy=tenancy,
            http=http,
            scripts=ScriptChecker(self.isolation),
            auth=_admin_auth(config, tenancy),
            peer_seal=peer_seal,
            token_seal=token_seal,
            instance_logs=logs if config.runtime == "process" else None,
            state=self.state,
            package_registry=PackageRegistry(
                self.metadata,
                self.assignments,
                self.leader,
                config.request_timeout_s,
                http,
                peer_seal,
            ),
        )
        self.metadata.start()
        self.assignments.start()
        self.runtime.start()
        self.reconciler.start()
        self.leader.start()
        self.membership.start()
        self._serve(create_app(services))
        log.info(
            "worker %s started: REST API at %s, broker %s",
            config.worker_id,
            config.admin_url,
            config.broker_url,
        )
        return self

    # The managers call back into each other; these bind late, after all are built.
    def _known_leader(self) -> WorkerInfo | None:
        """The leader of the newest assignment, once this worker has replayed them (an
        older one's leader may be long gone)."""
        current = self.assignments.current
        if current is None or not self.assignments.wait_caught_up(0):
            return None
        return current.leader

    def _known_workers(self) -> list[WorkerInfo]:
        """The workers of the newest assignment."""
        current = self.assignments.current
        return [] if current is None else current.workers

    def _report(self) -> WorkerReport:
        """For the heartbeats: the assignment applied here, and its instances here that do
        not run yet."""
        current = self.assignments.current
        if current is None:
            return WorkerReport(None)
        mine = {key for key, owner in current.assignment.items() if owner == self.config.worker_id}
        stopped = {
            instance_key(fqfn, i)
            for fqfn, record in self.metadata.functions().items()
            for i in record.stopped
        }
        return WorkerReport(
            (current.term, current.version),
            frozenset(mine - stopped - self.runtime.running_keys()),
        )

    def _on_leadership(self, leader: bool) -> None:
        self.leader.on_leadership(leader)

    def _on_members_changed(self) -> None:
        self.leader.notify()

    def _on_metadata_change(self) -> None:
        self.leader.notify()
        self.reconciler.notify()
        if self.metadata.wait_caught_up(0):
            # deleted functions' local state (their journals say what to keep)
            existing = set(self.metadata.functions())
            self.state.forget(existing)
            if self.isolation is not None:
                self.isolation.forget(existing)

    def _serve(self, app: Any) -> None:
        server = self._server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=self.config.http_host,
                port=self.config.http_port,
                log_level="warning",
                access_log=False,
            )
        )
        self._http_thread = threading.Thread(target=server.run, name="http", daemon=True)
        self._http_thread.start()
        while not server.started:
            if not self._http_thread.is_alive():
                raise OSError(
                    f"the REST API could not listen on {self.config.http_host}:"
                    f"{self.config.http_port} (is the port taken?)"
                )
            self._stopped.wait(0.05)

    def stop(self, drain: bool = True) -> None:
        """Leave the cluster: stop heartbeats (so leadership moves), stop the instances
        (gracefully with ``drain``), then everything else."""
        if self._stopped.is_set():
            return
        # the instances first: their drain runs while the rest stops, within the timeout
        self.runtime.stop(drain=drain, timeout_s=self.config.shutdown_timeout_s)
        self.membership.stop()
        self.leader.stop()
        self.reconciler.stop()
        # killed at the timeout; the wait after that is for the kills to take
        if not self.runtime.wait(self.config.shutdown_timeout_s + _KILL_GRACE_S):
            log.error(
                "worker %s: instances still running after the shutdown timeout",
                self.config.worker_id,
            )
        if self._server is not None:
            self._server.should_exit = True
        if self._http_thread is not None:
            self._http_thread.join(_KILL_GRACE_S)
        self.assignments.stop()
        self.metadata.stop()
        self.state.stop()
        self._http.close()
        if self._data_client is not None:
            self._data_client.close()
        self._client.close()
        if self._policies is not None:
            self._policies.close()
        self._stopped.set()
        log.info("worker %s stopped", self.config.worker_id)

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)


def _cluster_key(config: WorkerConfig) -> ClusterKey | None:
    """The key the workers share (required with authentication, see ``WorkerConfig``)."""
    if config.cluster_key:
        return ClusterKey.from_setting(config.cluster_key)
    log.warning(
        "no cluster_key: the records on the system topics and the calls between workers are "
        "not sealed, so any client of the broker can change this cluster's functions; give "
        "every worker the same cluster_key (magnetar tokens create-secret-key)"
    )
    return None


def _admin_auth(config: WorkerConfig, tenancy: Tenancy) -> AdminAuth | None:
    """Token checks for the admin API, when the config turns them on; tenant admins are the
    config's and those of each tenant's ``adminRoles``."""
    if not config.authentication_enabled:
        return None
    secret, public = config.token_secret_key, config.token_public_key
    return AdminAuth(
        TokenAuthenticator(
            secret_key=read_key(secret) if secret else None,
            public_key=read_key(public) if public else None,
            role_claim=config.token_auth_claim,
        ),
        RoleAuthorizer(config.superuser_roles, config.tenant_admin_roles, tenancy),
    )


def _instance_isolation(config: WorkerConfig) -> InstanceIsolation | None:
    """Isolated instances when the worker runs as root with the process runtime (and
    ``instance_isolation`` on)."""
    if not config.instance_isolation or os.geteuid() != 0:
        return None
    if config.runtime != "process":
        log.warning(
            "runtime %r runs functions inside the worker, as root: they are not isolated "
            "(use the process runtime for code you do not trust)",
            config.runtime,
        )
        return None
    root = config.instance_dir
    if root is None:
        shared = Path(tempfile.gettempdir()) / "magnetar-instances"
        secure_directory(shared, 0o711)  # the workers' directories are not listed either
        # one per data directory: workers of one id in two clusters on a host stay apart
        data_dir = hashlib.sha256(str(config.data_dir.resolve()).encode()).hexdigest()[:12]
        root = shared / f"{quote(config.worker_id, safe='')}-{data_dir}"
    exposed = readable_by_others(config.token_secret_key)
    if exposed is not None:
        log.warning(
            "the token secret key %s is readable by other users, so by functions too: "
            "chmod 600 it (and keep it in a directory they cannot search)",
            exposed,
        )
    unscoped = scopes_unavailable()
    if unscoped is not None:
        log.warning(
            "instances may connect to the abstract Unix sockets of this host's processes, "
            "other tenants' instances included: %s",
            unscoped,
        )
    unfiltered = filter_unavailable()
    if unfiltered is not None:
        log.warning(
            "instances may use the kernel's keyrings (which the next instance given their uid "
            "reads), user namespaces and io_uring: %s",
            unfiltered,
        )
    return InstanceIsolation(
        root, parse_uid_range(config.instance_uids), max_tasks=config.instance_max_tasks
    )
