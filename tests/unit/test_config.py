"""FunctionConfig: Pulsar-style JSON/YAML in, validated config (or a clear error) out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from magnetar.instance.config import (
    FunctionConfig,
    ProcessingGuarantees,
    SubscriptionPosition,
    SubscriptionType,
)
from magnetar.instance.exceptions import InvalidFunctionConfigError

# What `pulsar-admin functions create --function-config-file` takes for a Python function.
PULSAR_JSON = """
{
  "tenant": "acme",
  "namespace": "orders",
  "name": "exclaim",
  "className": "exclamation.ExclamationFunction",
  "py": "examples/exclamation.py",
  "runtime": "PYTHON",
  "inputs": ["persistent://acme/orders/in"],
  "customSerdeInputs": {"acme/orders/json-in": "json_serde.JsonSerDe"},
  "output": "persistent://acme/orders/out",
  "outputSerdeClassName": "json_serde.JsonSerDe",
  "logTopic": "acme/orders/logs",
  "processingGuarantees": "ATLEAST_ONCE",
  "userConfig": {"greeting": "Hi", "times": 2},
  "secrets": {"password": {"path": "db", "key": "pw"}},
  "parallelism": 3,
  "autoAck": true,
  "maxMessageRetries": 5,
  "deadLetterTopic": "acme/orders/dlq",
  "subName": "my-sub",
  "subscriptionPosition": "Earliest",
  "timeoutMs": 2500,
  "forwardSourceMessageProperty": false,
  "resources": {"cpu": 1.0, "ram": 1073741824, "disk": 10737418240},
  "runtimeFlags": "--verbose",
  "cleanupSubscription": true
}
"""


def parse(**fields: Any) -> FunctionConfig:
    """A config with one input topic plus ``fields`` (Pulsar's camelCase names)."""
    return FunctionConfig.parse({"name": "fn", "inputs": ["in"], **fields})


def parse_error(data: dict[str, Any]) -> str:
    with pytest.raises(InvalidFunctionConfigError) as caught:
        FunctionConfig.parse(data)
    return str(caught.value)


# --- parsing -------------------------------------------------------------------------------


def test_pulsar_style_camel_case_json_parses() -> None:
    config = FunctionConfig.parse(json.loads(PULSAR_JSON))

    assert config.fqfn == "acme/orders/exclaim"
    assert config.class_name == "exclamation.ExclamationFunction"
    assert config.py == "examples/exclamation.py"
    assert config.inputs == ["persistent://acme/orders/in"]
    assert config.custom_serde_inputs == {"acme/orders/json-in": "json_serde.JsonSerDe"}
    assert config.output == "persistent://acme/orders/out"
    assert config.output_serde_class_name == "json_serde.JsonSerDe"
    assert config.log_topic == "acme/orders/logs"
    assert config.user_config == {"greeting": "Hi", "times": 2}
    assert config.secrets == {"password": {"path": "db", "key": "pw"}}
    assert config.parallelism == 3
    assert config.max_message_retries == 5
    assert config.dead_letter_topic == "acme/orders/dlq"
    assert config.subscription_name == "my-sub"
    assert config.subscription_position is SubscriptionPosition.EARLIEST
    assert config.timeout_ms == 2500
    assert config.forward_source_message_property is False
    # Fields only Pulsar's own runtimes use are accepted.
    assert config.resources == {"cpu": 1.0, "ram": 1073741824, "disk": 10737418240}
    assert config.runtime_flags == "--verbose"
    # Short and full input names end up as full topic names with their SerDe.
    assert config.input_serdes() == {
        "persistent://acme/orders/in": None,
        "persistent://acme/orders/json-in": "json_serde.JsonSerDe",
    }


def test_snake_case_field_names_parse_to_the_same_config() -> None:
    camel = FunctionConfig.parse(
        {
            "name": "fn",
            "className": "m.C",
            "inputs": ["in"],
            "outputSerdeClassName": "m.S",
            "maxMessageRetries": 2,
            "deadLetterTopic": "dlq",
            "retainKeyOrdering": True,
        }
    )
    snake = FunctionConfig.parse(
        {
            "name": "fn",
            "class_name": "m.C",
            "inputs": ["in"],
            "output_serde_class_name": "m.S",
            "max_message_retries": 2,
            "dead_letter_topic": "dlq",
            "retain_key_ordering": True,
        }
    )
    assert snake == camel
    assert snake.class_name == "m.C"
    assert snake.max_message_retries == 2


def test_input_specs_with_serde_and_regex_pattern() -> None:
    config = FunctionConfig.parse(
        {
            "name": "fn",
            "inputSpecs": {
                "in-a": {"serdeClassName": "m.S", "receiverQueueSize": 10},
                "persistent://public/default/in-.*": {"isRegex": True},
            },
        }
    )
    assert config.input_serdes() == {"persistent://public/default/in-a": "m.S"}
    assert config.input_patterns() == ["persistent://public/default/in-.*"]
    assert config.input_specs["in-a"].receiver_queue_size == 10


def test_input_specs_accept_pulsars_is_regex_pattern_field() -> None:
    config = FunctionConfig.parse(
        {
            "name": "fn",
            "inputSpecs": {
                "persistent://public/default/my-topic-1": {"isRegexPattern": False},
                "persistent://public/default/in-.*": {"isRegexPattern": True},
            },
        }
    )
    assert config.input_patterns() == ["persistent://public/default/in-.*"]


def test_defaults() -> None:
    config = FunctionConfig.parse({"name": "fn", "inputs": ["in"]})

    assert config.tenant == "public"
    assert config.namespace == "default"
    assert config.fqfn == "public/default/fn"
    assert config.processing_guarantees is ProcessingGuarantees.ATLEAST_ONCE
    assert config.parallelism == 1
    assert config.auto_ack is True
    assert config.subscription_name == "public/default/fn"
    assert config.subscription_type is SubscriptionType.SHARED
    assert config.subscription_position is SubscriptionPosition.LATEST
    assert config.max_message_retries is None
    assert config.output is None
    assert config.forward_source_message_property is True


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, SubscriptionType.SHARED),
        ({"retainOrdering": True}, SubscriptionType.FAILOVER),
        ({"processingGuarantees": "EFFECTIVELY_ONCE"}, SubscriptionType.FAILOVER),
        ({"retainKeyOrdering": True}, SubscriptionType.KEY_SHARED),
        ({"processingGuarantees": "ATMOST_ONCE"}, SubscriptionType.SHARED),
        ({"processingGuarantees": "MANUAL", "autoAck": False}, SubscriptionType.SHARED),
    ],
)
def test_subscription_type(fields: dict[str, Any], expected: SubscriptionType) -> None:
    assert parse(**fields).subscription_type is expected


def test_subscription_type_values_are_pulsars_names() -> None:
    assert [t.value for t in SubscriptionType] == ["Shared", "Failover", "Key_Shared"]


# --- validation ----------------------------------------------------------------------------


def test_no_inputs() -> None:
    message = parse_error({"name": "fn"})
    assert "no input topic" in message
    assert "inputs" in message
    assert "topicsPattern" in message


@pytest.mark.parametrize(
    ("inputs", "output"),
    [
        (["in"], "in"),
        (["in"], "persistent://public/default/in"),
        (["persistent://public/default/in"], "in"),
        (["public/default/in"], "persistent://public/default/in"),
        (["acme/ns/in"], "persistent://acme/ns/in"),
        (["in"], "in-partition-2"),
    ],
)
def test_output_may_not_be_an_input(inputs: list[str], output: str) -> None:
    message = parse_error({"name": "fn", "inputs": inputs, "output": output})
    assert f"output topic {output!r} is also an input topic" in message


def test_output_overlapping_a_custom_serde_input() -> None:
    message = parse_error(
        {"name": "fn", "customSerdeInputs": {"in": "m.S"}, "output": "public/default/in"}
    )
    assert "is also an input topic" in message


def test_output_of_another_tenant_is_not_an_overlap() -> None:
    config = parse(output="acme/default/in")
    assert config.output == "acme/default/in"


def test_dead_letter_topic_without_max_message_retries() -> None:
    message = parse_error({"name": "fn", "inputs": ["in"], "deadLetterTopic": "dlq"})
    assert "deadLetterTopic" in message
    assert "maxMessageRetries" in message


def test_dead_letter_topic_with_max_message_retries_is_valid() -> None:
    config = parse(deadLetterTopic="dlq", maxMessageRetries=3)
    assert (config.dead_letter_topic, config.max_message_retries) == ("dlq", 3)


@pytest.mark.parametrize("retries", [0, -1])
def test_max_message_retries_below_one_is_refused(retries: int) -> None:
    message = parse_error({"name": "fn", "inputs": ["in"], "maxMessageRetries": retries})
    assert f"maxMessageRetries must be at least 1, not {retries}" in message


def test_max_message_retries_with_effectively_once() -> None:
    message = parse_error(
        {
            "name": "fn",
            "inputs": ["in"],
            "maxMessageRetries": 3,
            "processingGuarantees": "EFFECTIVELY_ONCE",
        }
    )
    assert "maxMessageRetries" in message
    assert "EFFECTIVELY_ONCE" in message


def test_zero_max_message_retries_with_effectively_once() -> None:
    message = parse_error(
        {
            "name": "fn",
            "inputs": ["in"],
            "maxMessageRetries": 0,
            "processingGuarantees": "EFFECTIVELY_ONCE",
        }
    )
    assert "maxMessageRetries" in message


def test_atmost_once_with_auto_ack_false() -> None:
    message = parse_error(
        {"name": "fn", "inputs": ["in"], "processingGuarantees": "ATMOST_ONCE", "autoAck": False}
    )
    assert "autoAck=false" in message
    assert "ATMOST_ONCE" in message


def test_retain_ordering_and_retain_key_ordering() -> None:
    message = parse_error(
        {"name": "fn", "inputs": ["in"], "retainOrdering": True, "retainKeyOrdering": True}
    )
    assert "retainOrdering and retainKeyOrdering are mutually exclusive" in message


@pytest.mark.parametrize("parallelism", [0, -1])
def test_parallelism_below_one(parallelism: int) -> None:
    message = parse_error({"name": "fn", "inputs": ["in"], "parallelism": parallelism})
    assert "parallelism" in message
    assert "greater than or equal to 1" in message


def test_invalid_topics_pattern() -> None:
    message = parse_error({"name": "fn", "topicsPattern": "persistent://public/default/(in"})
    assert "topicsPattern 'persistent://public/default/(in' is not a valid regex" in message


def test_valid_topics_pattern_is_an_input() -> None:
    config = FunctionConfig.parse(
        {"name": "fn", "topicsPattern": "persistent://public/default/in-.*"}
    )
    assert config.input_patterns() == ["persistent://public/default/in-.*"]
    assert config.input_serdes() == {}


def test_unknown_field() -> None:
    message = parse_error({"name": "fn", "inputs": ["in"], "outputTopic": "out"})
    assert "outputTopic: unknown field" in message


def test_unknown_field_inside_input_specs() -> None:
    message = parse_error({"name": "fn", "inputSpecs": {"in": {"serde": "m.S"}}})
    assert "inputSpecs.in.serde: unknown field" in message


@pytest.mark.parametrize(
    "fields",
    [
        {"inputs": ["a/b"]},
        {"inputs": ["in"], "output": "a/b/c/d"},
        {"inputs": ["http://public/default/in"]},
        {"inputs": ["in"], "logTopic": "tenant/logs"},
        {"inputs": ["in"], "deadLetterTopic": "x//y", "maxMessageRetries": 1},
        {"customSerdeInputs": {"a/b": "m.S"}},
    ],
)
def test_bad_topic_name(fields: dict[str, Any]) -> None:
    message = parse_error({"name": "fn", **fields})
    assert "invalid topic name" in message


def test_wrong_enum_value_lists_the_allowed_values() -> None:
    message = parse_error({"name": "fn", "inputs": ["in"], "processingGuarantees": "ALWAYS"})
    assert "processingGuarantees" in message
    assert "ATLEAST_ONCE" in message


@pytest.mark.parametrize("field", ["tenant", "namespace", "name"])
def test_fqfn_parts_may_not_contain_a_slash(field: str) -> None:
    message = parse_error({"name": "fn", "inputs": ["in"], field: "a/b"})
    assert f"{field} 'a/b' must be non-empty and contain no '/'" in message


def test_unsupported_runtime() -> None:
    message = parse_error({"name": "fn", "inputs": ["in"], "runtime": "JAVA"})
    assert "runtime 'JAVA' is not supported" in message


def test_several_field_errors_are_all_reported() -> None:
    message = parse_error({"name": "fn", "inputs": ["in"], "parallelism": 0, "typo": 1})
    assert message.startswith("invalid function config: ")
    assert "parallelism" in message
    assert "typo: unknown field" in message


# --- files ---------------------------------------------------------------------------------


def test_from_json_file(tmp_path: Path) -> None:
    path = tmp_path / "function.json"
    path.write_text(PULSAR_JSON)
    assert FunctionConfig.from_file(path) == FunctionConfig.parse(json.loads(PULSAR_JSON))


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
def test_from_yaml_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"function{suffix}"
    path.write_text(
        "tenant: acme\n"
        "namespace: orders\n"
        "name: exclaim\n"
        "className: exclamation.ExclamationFunction\n"
        "inputs:\n"
        "  - in-a\n"
        "  - in-b\n"
        "output: out\n"
        "processingGuarantees: EFFECTIVELY_ONCE\n"
        "userConfig:\n"
        "  greeting: Hi\n"
    )
    config = FunctionConfig.from_file(str(path))
    assert config.fqfn == "acme/orders/exclaim"
    assert config.inputs == ["in-a", "in-b"]
    assert config.output == "out"
    assert config.user_config == {"greeting": "Hi"}
    assert config.subscription_type is SubscriptionType.FAILOVER


def test_from_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(InvalidFunctionConfigError) as caught:
        FunctionConfig.from_file(path)
    message = str(caught.value)
    assert f"cannot read function config file {path}" in message
    assert "No such file or directory" in message


def test_from_malformed_json_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"name": "fn", "inputs": ["in"],}')
    with pytest.raises(InvalidFunctionConfigError) as caught:
        FunctionConfig.from_file(path)
    assert f"function config file {path} is not valid json" in str(caught.value)


def test_from_malformed_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: fn\ninputs: [in\n")
    with pytest.raises(InvalidFunctionConfigError) as caught:
        FunctionConfig.from_file(path)
    assert f"function config file {path} is not valid yaml" in str(caught.value)


def test_from_file_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- name: fn\n")
    with pytest.raises(InvalidFunctionConfigError) as caught:
        FunctionConfig.from_file(path)
    assert f"function config file {path} must hold a mapping" in str(caught.value)


def test_from_file_with_an_invalid_config(tmp_path: Path) -> None:
    path = tmp_path / "function.json"
    path.write_text('{"name": "fn", "inputs": ["in"], "parallelism": 0}')
    with pytest.raises(InvalidFunctionConfigError, match="parallelism"):
        FunctionConfig.from_file(path)


# --- to_json -------------------------------------------------------------------------------


def test_to_json_round_trip() -> None:
    config = FunctionConfig.parse(json.loads(PULSAR_JSON))
    data = json.loads(config.to_json())

    assert FunctionConfig.parse(data) == config
    assert data["className"] == "exclamation.ExclamationFunction"
    assert data["processingGuarantees"] == "ATLEAST_ONCE"
    assert data["subscriptionPosition"] == "Earliest"
    assert data["customSerdeInputs"] == {"acme/orders/json-in": "json_serde.JsonSerDe"}
    assert "class_name" not in data


def test_to_json_leaves_unset_fields_out() -> None:
    data = json.loads(parse(inputSpecs={"other": {"serdeClassName": "m.S"}}).to_json())

    assert data["inputs"] == ["in"]
    assert data["inputSpecs"] == {"other": {"serdeClassName": "m.S", "isRegexPattern": False}}
    assert "output" not in data
    assert "maxMessageRetries" not in data
    assert FunctionConfig.parse(data) == parse(inputSpecs={"other": {"serdeClassName": "m.S"}})


def test_config_is_immutable() -> None:
    config = parse()
    with pytest.raises(ValueError, match="frozen"):
        config.parallelism = 2  # type: ignore[misc]
