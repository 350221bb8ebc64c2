"""The instance options that depend on the broker an instance runs on."""

from __future__ import annotations

from dataclasses import replace

from magnetar.client import shared_acks_cost_gaps
from magnetar.instance.config import FunctionConfig, ProcessingGuarantees, SubscriptionType
from magnetar.instance.options import InstanceOptions
from magnetar.instance.subscription import instances_share

__all__ = ["for_broker"]


def for_broker(
    options: InstanceOptions, config: FunctionConfig, broker_url: str
) -> InstanceOptions:
    """``options`` as the broker at ``broker_url`` needs them for ``config``'s instances; the
    broker is asked what it is only where that matters, and once (a connection's round trip)."""
    effectively_once = config.processing_guarantees is ProcessingGuarantees.EFFECTIVELY_ONCE
    ordered = config.subscription_type is SubscriptionType.FAILOVER
    shared = instances_share(config)
    if not (effectively_once or ordered or shared):
        return options
    lite = shared_acks_cost_gaps(broker_url)  # says whether it is pulsar-lite
    return replace(
        options,
        broker_may_deduplicate=not lite,
        shared_acks_cost_gaps=shared and lite,
        stranded_check_s=None if ordered and lite else options.stranded_check_s,
    )
