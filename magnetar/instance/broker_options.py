"""The instance options that depend on the broker an instance runs on."""

from __future__ import annotations

from dataclasses import replace

from magnetar.client import may_deduplicate, may_strand_take_overs, shared_acks_cost_gaps
from magnetar.instance.config import FunctionConfig, ProcessingGuarantees, SubscriptionType
from magnetar.instance.options import InstanceOptions
from magnetar.instance.subscription import instances_share

__all__ = ["for_broker"]


def for_broker(
    options: InstanceOptions, config: FunctionConfig, broker_url: str
) -> InstanceOptions:
    """``options`` as the broker at ``broker_url`` needs them for ``config``'s instances; the
    broker is asked only where it matters (a connection's round trip each time)."""
    effectively_once = config.processing_guarantees is ProcessingGuarantees.EFFECTIVELY_ONCE
    ordered = config.subscription_type is SubscriptionType.FAILOVER
    return replace(
        options,
        broker_may_deduplicate=not effectively_once or may_deduplicate(broker_url),
        shared_acks_cost_gaps=instances_share(config) and shared_acks_cost_gaps(broker_url),
        stranded_check_s=(
            options.stranded_check_s if not ordered or may_strand_take_overs(broker_url) else None
        ),
    )
