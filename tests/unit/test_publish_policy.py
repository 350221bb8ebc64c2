"""Where ``context.publish`` may reach: never the system namespace; with authentication on,
only the function's tenant unless its role is a superuser."""

from __future__ import annotations

import pytest

from magnetar.instance.publish_policy import (
    ANYWHERE,
    PublishPolicy,
    PublishRefusedError,
    check_publish_topic,
)
from magnetar.worker.function_auth import FunctionAccess, FunctionAuthData

SYSTEM = PublishPolicy("public/magnetar", other_tenants=True)
OWN_TENANT = PublishPolicy("public/magnetar", other_tenants=False)


@pytest.mark.parametrize(
    "topic", ["persistent://public/magnetar/metadata", "public/magnetar/assignments"]
)
def test_the_system_namespace_is_refused_to_everyone(topic: str) -> None:
    with pytest.raises(PublishRefusedError) as refused:
        check_publish_topic(topic, "public", SYSTEM)
    assert str(refused.value) == (
        f"may not publish to persistent://{topic.removeprefix('persistent://')}: "
        "public/magnetar is the functions worker's system namespace"
    )


def test_other_tenants_are_refused_unless_allowed() -> None:
    check_publish_topic("persistent://acme/prod/out", "acme", OWN_TENANT)
    check_publish_topic("non-persistent://acme/prod/out", "acme", OWN_TENANT)
    check_publish_topic("public/default/out", "acme", SYSTEM)
    with pytest.raises(PublishRefusedError, match="it belongs to tenant 'public'"):
        check_publish_topic("out", "acme", OWN_TENANT)  # a short name is public/default's
    # a namespace named like the system one in another tenant is not the system namespace
    check_publish_topic("acme/magnetar/metadata", "acme", OWN_TENANT)


def test_without_a_worker_anything_goes_but_a_malformed_name() -> None:
    check_publish_topic("persistent://public/functions/metadata", "acme", ANYWHERE)
    with pytest.raises(ValueError, match="invalid topic name"):
        check_publish_topic("a/b", "acme", ANYWHERE)


def test_a_functions_access_follows_its_submitter() -> None:
    access = FunctionAccess(True, ["admin"], "public/magnetar")
    superuser, tenant_admin = FunctionAuthData("admin", "t1"), FunctionAuthData("acme-admin", "t2")
    assert access.publish_policy(superuser) == SYSTEM
    assert access.publish_policy(tenant_admin) == OWN_TENANT
    connection = access.connection(tenant_admin)
    assert connection is not None and connection.auth_params == "token:t2"
    assert access.role(tenant_admin) == "acme-admin"  # granted its state topics as that role
    # authentication off: no credentials, every tenant (as before), still not the system's
    open_access = FunctionAccess(False, [], "public/magnetar")
    assert open_access.connection(tenant_admin) is None
    assert open_access.role(tenant_admin) is None
    assert open_access.publish_policy(None) == SYSTEM
