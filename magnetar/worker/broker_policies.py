"""What a worker asks of an Apache Pulsar broker through its admin API, when it has one.

The embedded broker has no admin API and needs none (it keeps every message). On Apache
Pulsar these are the policies Magnetar's design relies on:

* **Retention, forever, on the system namespace.** Metadata, assignments, packages and state
  journals are replayed from their first message by readers, which hold no backlog: without
  retention Apache Pulsar deletes a topic's older ledgers, and a worker that starts later
  could not rebuild the cluster's state.
* **No retention for heartbeats.** The coordination topic is only ever consumed live, so it
  opts out of the namespace's retention instead of growing forever.
* **A compaction threshold on the metadata, assignments and packages topics.** The broker
  compacts them by itself. This is safe for Magnetar's replays: compaction rewrites only
  messages with a key, and only readers that ask for the compacted view see it.
* **Deduplication of EFFECTIVELY_ONCE outputs.** An instance sends each output with a sequence
  id that grows with its input's position, through a producer named after the input partition
  (see ``magnetar.instance.partition_outputs``), and the broker drops a message whose sequence
  id is not above the last one it stored for that producer name: the outputs of inputs
  replayed after a crash are not stored twice.
* **A function's role may use its own state topics.** With authorization on, the broker
  refuses a function's role everything in the system namespace; its state journal and
  snapshot topics live there (``magnetar.statestore.journal``), and the instance, connected
  with its function's credentials, produces and consumes them. The worker grants the role
  ``produce`` and ``consume`` on those two topics, and on nothing else of the namespace.

Every failure is logged and never raised: the worker goes on without the policy.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable

from magnetar.instance.config import FunctionConfig, ProcessingGuarantees
from magnetar.statestore.journal import journal_topic, snapshot_topic
from magnetar.topics import full_topic_name
from magnetar.worker.broker_admin import FOREVER, BrokerAdmin
from magnetar.worker.config import WorkerConfig
from magnetar.worker.exceptions import (
    BrokerAdminError,
    BrokerAdminUnreachableError,
    WorkerConfigError,
)
from magnetar.worker.runtime import InstanceSpec, Runtime, RuntimeHandle

__all__ = [
    "COMPACTION_THRESHOLD_BYTES",
    "BrokerPolicies",
    "BrokerPreparedRuntime",
    "broker_policies",
]

log = logging.getLogger(__name__)

COMPACTION_THRESHOLD_BYTES = 64 * 1024 * 1024
"""Backlog of a system topic above which the broker compacts it."""


class BrokerPolicies:
    """Applies Magnetar's broker policies through ``admin``; logs failures, never raises."""

    def __init__(self, admin: BrokerAdmin) -> None:
        self._admin = admin
        self._lock = threading.Lock()
        self._deduplicated: dict[str, bool] = {}
        self._granted: set[tuple[str, str]] = set()

    @property
    def admin(self) -> BrokerAdmin:
        """The admin API client, for the worker's other calls to the broker (tenancy)."""
        return self._admin

    def close(self) -> None:
        self._admin.close()

    def prepare_system_namespace(self, config: WorkerConfig) -> bool:
        """Create the system namespace and set its policies; False if any step failed."""
        admin = self._admin
        namespace = config.system_namespace
        coordination = config.system_topic(config.coordination_topic)
        compacted = [
            config.system_topic(name)
            for name in (config.metadata_topic, config.assignments_topic, config.packages_topic)
        ]
        steps: list[Callable[[], object]] = [
            lambda: admin.create_namespace(namespace),
            lambda: admin.set_namespace_retention(namespace, FOREVER, FOREVER),
            lambda: admin.create_topic(coordination),
            lambda: admin.set_topic_retention(coordination, 0, 0),
        ]
        for topic in compacted:
            steps.append(functools.partial(admin.create_topic, topic))
            steps.append(
                functools.partial(admin.set_compaction_threshold, topic, COMPACTION_THRESHOLD_BYTES)
            )
        failures = 0
        try:
            admin.clusters()  # is this a Pulsar admin API at all?
            for step in steps:
                try:
                    step()
                except BrokerAdminUnreachableError:
                    raise
                except BrokerAdminError as error:
                    failures += 1
                    log.error("broker admin: %s; the worker goes on without it", error)
        except BrokerAdminError as error:
            log.error(
                "broker admin: %s; the system namespace %s was not prepared, so the worker "
                "goes on as if the broker had no admin API",
                error,
                namespace,
            )
            return False
        if failures:
            return False
        log.info(
            "broker admin %s: namespace %s keeps its messages forever (heartbeats excepted); "
            "%s are compacted above %d MiB",
            admin.url,
            namespace,
            ", ".join(compacted),
            COMPACTION_THRESHOLD_BYTES // (1024 * 1024),
        )
        return True

    def ensure_deduplication(self, config: FunctionConfig) -> bool:
        """Turn on deduplication of an EFFECTIVELY_ONCE function's output topic, once per
        output; True if the output is deduplicated."""
        if config.processing_guarantees is not ProcessingGuarantees.EFFECTIVELY_ONCE:
            return False
        if not config.output:
            return False
        output = full_topic_name(config.output)
        with self._lock:
            decided = self._deduplicated.get(output)
            if decided is not None:
                return decided
            try:
                decided = self._deduplicate(config.fqfn, output)
            except BrokerAdminError as error:
                log.error(
                    "broker admin: %s; %s runs without broker-side deduplication of %s "
                    "(a replay after a crash may repeat some of its outputs); tried again when "
                    "an instance of it starts",
                    error,
                    config.fqfn,
                    output,
                )
                return False
            self._deduplicated[output] = decided
            return decided

    def grant_state_topics(self, fqfn: str, role: str, namespace: str) -> bool:
        """Let ``role`` produce to and consume from the journal and snapshot topics of
        ``fqfn`` (in the system namespace ``namespace``), once per function and role; True if
        it may."""
        with self._lock:
            if (fqfn, role) in self._granted:
                return True
            topics = (journal_topic(fqfn, namespace), snapshot_topic(fqfn, namespace))
            try:
                for topic in topics:
                    self._admin.create_topic(topic)
                    self._admin.grant_permission(topic, role, ["produce", "consume"])
            except BrokerAdminError as error:
                log.error(
                    "broker admin: %s; %s cannot keep state with its role %r until it is "
                    "granted (tried again when an instance of it starts)",
                    error,
                    fqfn,
                    role,
                )
                return False
            self._granted.add((fqfn, role))
            return True

    def _deduplicate(self, fqfn: str, output: str) -> bool:
        if not output.startswith("persistent://"):
            log.warning(
                "%s is EFFECTIVELY_ONCE but its output %s is not persistent: the broker "
                "cannot deduplicate it",
                fqfn,
                output,
            )
            return False
        self._admin.create_topic(output)
        self._admin.enable_deduplication(output)
        log.info(
            "broker admin: deduplication is on for %s, the output of EFFECTIVELY_ONCE function %s",
            output,
            fqfn,
        )
        return True


class BrokerPreparedRuntime:
    """A :class:`Runtime` that has the broker ready for an instance before the wrapped runtime
    starts it: an EFFECTIVELY_ONCE output deduplicated, and, when the instance connects with
    its function's role, that role granted its state topics (in ``state_namespace``). Admin
    failures are logged; the instance starts."""

    def __init__(self, runtime: Runtime, policies: BrokerPolicies, state_namespace: str) -> None:
        self._runtime = runtime
        self._policies = policies
        self._state_namespace = state_namespace

    def prepare(self) -> None:
        self._runtime.prepare()

    def close(self) -> None:
        self._runtime.close()

    def start(self, spec: InstanceSpec) -> RuntimeHandle:
        self._policies.ensure_deduplication(spec.config)
        if spec.role is not None:
            self._policies.grant_state_topics(spec.fqfn, spec.role, self._state_namespace)
        return self._runtime.start(spec)


def broker_policies(config: WorkerConfig) -> BrokerPolicies | None:
    """The policies for ``config.pulsar_admin_url``; None without one: nothing is asked."""
    if not config.pulsar_admin_url:
        return None
    connection = config.broker_connection
    try:
        token = connection.bearer_token() if connection is not None else None
    except OSError as error:
        raise WorkerConfigError(
            f"cannot read the worker's broker token ({config.broker_client_authentication_plugin}"
            f"): {error}"
        ) from None
    return BrokerPolicies(
        BrokerAdmin(config.pulsar_admin_url, config.request_timeout_s, token=token)
    )
