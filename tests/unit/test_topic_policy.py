"""The topic rule: a tenant's functions name its topics only; nobody's name the system
namespace's."""

from __future__ import annotations

from typing import Any

import pytest

from magnetar.topic_policy import TopicRefusal, check_topic, check_topics

SYSTEM = "public/magnetar"


def refusal(config: dict[str, Any], superuser: bool = False) -> TopicRefusal | None:
    return check_topics(config, "acme", SYSTEM, superuser)


def test_a_function_names_its_tenants_topics() -> None:
    config = {
        "inputs": ["persistent://acme/prod/in", "acme/dev/other"],
        "topicsPattern": "persistent://acme/prod/in-.*",
        "inputSpecs": {"acme/prod/spec": {"serdeClassName": "x.Y"}},
        "customSerdeInputs": {"acme/prod/serde": "x.Y"},
        "customSchemaInputs": {"non-persistent://acme/prod/schema": "JSON"},
        "output": "acme/prod/out",
        "logTopic": "acme/prod/log",
        "deadLetterTopic": "acme/prod/dlq",
        "windowConfig": {"lateDataTopic": "acme/prod/late"},
    }
    assert refusal(config) is None


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (
            {"inputs": ["persistent://beta/prod/in"]},
            "Unauthorized to validateTopicOperation for operation [CONSUME] on topic "
            "[persistent://beta/prod/in]",
        ),
        (
            {"inputs": ["in"]},  # a short name is public/default's
            "Unauthorized to validateTopicOperation for operation [CONSUME] on topic "
            "[persistent://public/default/in]",
        ),
        (
            {"topicsPattern": "persistent://beta/prod/.*"},
            "Unauthorized to validateTopicOperation for operation [CONSUME] on topic "
            "[persistent://beta/prod/.*]",
        ),
        (
            {"topicsPattern": "persistent://beta/prod/x/(a|b)"},  # '/' in the regex part
            "Unauthorized to validateTopicOperation for operation [CONSUME] on topic "
            "[persistent://beta/prod/x/(a|b)]",
        ),
        (
            {"inputSpecs": {"beta/prod/in": {}}},
            "Unauthorized to validateTopicOperation for operation [CONSUME] on topic "
            "[persistent://beta/prod/in]",
        ),
        (
            {"custom_serde_inputs": {"beta/prod/in": "x.Y"}},  # snake_case too
            "Unauthorized to validateTopicOperation for operation [CONSUME] on topic "
            "[persistent://beta/prod/in]",
        ),
        (
            {"customSchemaInputs": {"beta/prod/in": "JSON"}},
            "Unauthorized to validateTopicOperation for operation [CONSUME] on topic "
            "[persistent://beta/prod/in]",
        ),
        (
            {"output": "beta/prod/out"},
            "Unauthorized to validateTopicOperation for operation [PRODUCE] on topic "
            "[persistent://beta/prod/out]",
        ),
        (
            {"logTopic": "non-persistent://beta/prod/log"},
            "Unauthorized to validateTopicOperation for operation [PRODUCE] on topic "
            "[non-persistent://beta/prod/log]",
        ),
        (
            {"deadLetterTopic": "beta/prod/dlq"},
            "Unauthorized to validateTopicOperation for operation [PRODUCE] on topic "
            "[persistent://beta/prod/dlq]",
        ),
        (
            {"windowConfig": {"lateDataTopic": "beta/prod/late"}},
            "Unauthorized to validateTopicOperation for operation [PRODUCE] on topic "
            "[persistent://beta/prod/late]",
        ),
    ],
)
def test_another_tenants_topic_is_refused_as_pulsar_refuses_a_topic_operation(
    config: dict[str, Any], reason: str
) -> None:
    found = refusal(config)
    assert found is not None and (found.reason, found.system) == (reason, False)
    assert refusal(config, superuser=True) is None


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"inputs": ["persistent://public/magnetar/metadata"]}, "inputs"),
        ({"inputs": ["public/magnetar/assignments-partition-0"]}, "inputs"),
        ({"topicsPattern": "persistent://public/magnetar/.*"}, "topicsPattern"),
        ({"topicsPattern": "persistent://publi./magnet.*/state-.*"}, "topicsPattern"),
        (
            {"inputSpecs": {"persistent://p.*/m.*/x": {"isRegexPattern": True}}},
            "inputSpecs[persistent://p.*/m.*/x]",
        ),
        ({"output": "non-persistent://public/magnetar/coordinate"}, "output"),
        ({"logTopic": "public/magnetar/packages"}, "logTopic"),
        ({"deadLetterTopic": "public/magnetar/state-acme-prod-f"}, "deadLetterTopic"),
    ],
)
def test_no_function_names_the_system_namespace(config: dict[str, Any], field: str) -> None:
    for superuser in (False, True):
        found = check_topics(config, "public", SYSTEM, superuser)
        assert found is not None and found.system, (config, superuser)
        assert found.reason.startswith(f"{field} names ")
        assert "a topic of the system namespace public/magnetar" in found.reason


def test_a_literal_name_is_read_literally_and_the_system_namespace_is_the_configs() -> None:
    # '.' in a topic's tenant or namespace is a character, not a wildcard
    assert check_topic("persistent://publi./magnet./x", "publi.", SYSTEM, False) is None
    assert check_topic("public/functions/metadata", "public", SYSTEM, False) is None
    found = check_topic("public/functions/metadata", "public", "public/functions", False)
    assert found is not None and found.system
    assert str(found) == found.reason
