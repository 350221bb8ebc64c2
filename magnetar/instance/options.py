"""How an instance talks to the broker: the knobs a worker or a test may turn."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from magnetar.instance.archive import DEFAULT_ARCHIVE_LIMITS, ArchiveLimits
from magnetar.instance.publish_policy import ANYWHERE, PublishPolicy
from magnetar.instance.url_hosts import PUBLIC_HOSTS, UrlHostRule

__all__ = ["InstanceOptions"]


@dataclass(frozen=True)
class InstanceOptions:
    """How an instance talks to the broker; defaults suit most functions."""

    instance_id: int = 0
    """Index of this instance among the function's ``parallelism`` instances."""
    receiver_queue_size: int = 1000
    """Messages prefetched per consumer: the instance's bounded input queue (unless the
    function's ``inputSpecs`` set ``receiverQueueSize``, or see ``shared_acks_cost_gaps``)."""
    shared_acks_cost_gaps: bool = False
    """The broker's work for each acknowledgement on a shared subscription grows with the
    gaps between acknowledged messages (pulsar-lite): prefetch few and acknowledge at once
    (see ``subscription``)."""
    max_chunk: int = 500
    """Most messages processed between two acknowledgement rounds."""
    max_unacked: int = 20_000
    """Inputs processed or held for a retry but not yet acknowledged before the instance
    waits."""
    batching_max_publish_delay_ms: int = 10
    """How long the output producer waits to fill a batch."""
    broker_may_deduplicate: bool = True
    """Whether the broker may deduplicate (any but pulsar-lite): EFFECTIVELY_ONCE outputs then
    go through unbatched producers named per input partition (see ``partition_outputs``);
    otherwise through one batched producer, as under ATLEAST_ONCE."""
    output_producer_idle_s: float = 2.0
    """EFFECTIVELY_ONCE: an input partition's output producer unused this long is closed, so
    an instance that took that partition over can open one of the same name."""
    large_message_bytes: int = 64 * 1024
    """Sends at least this big get a callback of their own (they can fail alone)."""
    retry_delay_ms: int = 1000
    """Wait before a failed message is processed again; it doubles with every failure of
    that message, up to ``max_retry_delay_ms`` (Pulsar's redelivery backoff)."""
    max_retry_delay_ms: int = 60_000
    """Longest wait between two attempts at a failing message."""
    stranded_check_s: float | None = 5.0
    """On an ordered (Failover) subscription whose inputs the instance acknowledges itself:
    once it has held and received nothing this long, it asks the broker to send what is
    unacknowledged again, what a take-over left unsent included (see ``stranded``); then after
    twice as long, and so on. None: never (pulsar-lite, which rewinds a take-over itself,
    ignores the request)."""
    poll_interval_ms: int = 100
    """Longest wait for input before the instance checks for stop and acks."""
    metrics_interval_s: float = 2.0
    """How often ``on_metrics`` receives a snapshot."""
    drain_timeout_s: float = 30.0
    """Longest wait for in-flight sends on a graceful stop."""
    send_timeout_ms: int = 30_000
    """How long a send may wait for the broker before it fails (its inputs are redelivered);
    EFFECTIVELY_ONCE outputs on a deduplicating broker wait as long as it takes."""
    window_restore_timeout_s: float = 10.0
    """After a restart, how long a window function waits for the inputs its windows held to be
    delivered again before its windows go on without those still missing."""
    worker_id: str = ""
    """The worker running this instance (reported in status)."""
    function_version: str = ""
    """Version of the function's code/config, reported by the context."""
    secrets_provider_classname: str | None = None
    """The secrets provider answering ``context.get_secret`` (see ``secrets``); Apache's
    default, the clear-text one, when None."""
    secrets_provider_config: Any = None
    """What the secrets provider's ``init`` is given."""
    archive_limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS
    """How much the function's code package may unpack to (the worker's settings)."""
    in_flight_path: str | None = None
    """The file where the message in user code is recorded (see ``in_flight``); None records
    nothing."""
    earlier_crashes: Mapping[str, int] = field(default_factory=dict)
    """``message_key`` -> how often an earlier process of this instance died with that message
    in user code: each death is a failure of the message (retried, then dead-lettered)."""
    publish_policy: PublishPolicy = ANYWHERE
    """Where ``context.publish`` may reach (see ``publish_policy``); anywhere by default."""
    url_hosts: UrlHostRule = PUBLIC_HOSTS
    """Where a JavaScript function's URL bindings may connect (the worker's
    ``url_binding_hosts``, see ``url_hosts``); public hosts only by default."""
