"""Which topics ``context.publish`` may reach at run time (Python and JavaScript alike).

A function never publishes into the worker's system namespace (its metadata, assignments and
packages live there), and, with authentication on, only to its own tenant's topics unless
its role is a superuser. The broker enforces the same with authorization on (Apache Pulsar);
this check is what holds where it does not (pulsar-lite) for what goes through the context.
"""

from __future__ import annotations

from dataclasses import dataclass

from magnetar.instance.exceptions import InstanceError
from magnetar.topics import full_topic_name

__all__ = ["ANYWHERE", "PublishPolicy", "PublishRefusedError", "check_publish_topic"]


class PublishRefusedError(InstanceError):
    """``context.publish`` named a topic the function may not publish to."""


@dataclass(frozen=True)
class PublishPolicy:
    """What the worker tells its instance about where it may publish."""

    system_namespace: str | None = None
    """The worker's system namespace (``tenant/namespace``); None: none (localrun)."""
    other_tenants: bool = True
    """Whether topics of other tenants are allowed (authentication off, or a superuser)."""


ANYWHERE = PublishPolicy()
"""No limit: localrun, tests, a worker's defaults."""


def check_publish_topic(topic: str, tenant: str, policy: PublishPolicy) -> None:
    """Raise ``PublishRefusedError`` (``ValueError`` for a malformed name) unless a function
    of ``tenant`` may publish to ``topic``."""
    full = full_topic_name(topic)
    topic_tenant, topic_namespace, _ = full.partition("://")[2].split("/")
    if policy.system_namespace is not None and (
        f"{topic_tenant}/{topic_namespace}" == policy.system_namespace
    ):
        raise PublishRefusedError(
            f"may not publish to {full}: {policy.system_namespace} is the functions worker's "
            "system namespace"
        )
    if not policy.other_tenants and topic_tenant != tenant:
        raise PublishRefusedError(
            f"may not publish to {full}: it belongs to tenant {topic_tenant!r}, and a function "
            f"of tenant {tenant!r} publishes only to its tenant's topics"
        )
