"""windowConfig as Apache Pulsar reads it (defaults, and refusals with its messages), and the
windows' checkpoint as it is stored."""

from __future__ import annotations

from typing import Any

import pytest

from magnetar.instance import FunctionConfig, InvalidFunctionConfigError
from magnetar.instance.delivery import Chunk
from magnetar.instance.windowing.checkpoint import (
    Buffered,
    Checkpoint,
    CheckpointQueue,
    DoneRuns,
)
from magnetar.instance.windowing.engine import EngineState

BASE = {"name": "w", "py": "w.py", "inputs": ["in"], "output": "out"}


def parse(window: dict[str, Any], **fields: Any) -> FunctionConfig:
    return FunctionConfig.parse({**BASE, **fields, "windowConfig": window})


def test_a_window_without_sliding_interval_is_tumbling_and_has_no_auto_ack() -> None:
    config = parse({"windowLengthCount": 100}, autoAck=True)  # the windows acknowledge
    assert config.window_config is not None
    assert config.window_config.sliding_interval_count == 100
    assert config.auto_ack is False
    exported = FunctionConfig.model_validate_json(config.to_json())
    assert exported == config
    timed = parse({"windowLengthDurationMs": 5000})
    assert timed.window_config is not None
    assert timed.window_config.sliding_interval_duration_ms == 5000


def test_event_time_defaults_are_pulsars() -> None:
    config = parse({"windowLengthDurationMs": 10, "timestampExtractorClassName": "ts.Extractor"})
    window = config.window_config
    assert window is not None
    assert (window.max_lag_ms, window.watermark_emit_interval_ms) == (0, 1000)
    assert window.event_time


def test_a_sliding_interval_of_the_other_kind_is_kept_alone() -> None:
    window = parse({"windowLengthCount": 10, "slidingIntervalDurationMs": 500}).window_config
    assert window is not None
    assert (window.sliding_interval_count, window.sliding_interval_duration_ms) == (None, 500)
    assert not window.count_triggered


@pytest.mark.parametrize(
    ("window", "message"),
    [
        ({}, "Window length is not specified"),
        (
            {"windowLengthCount": 1, "windowLengthDurationMs": 1},
            "Window length for time and count are set! Please set one or the other.",
        ),
        ({"windowLengthCount": 0}, "Window length must be positive [0]"),
        ({"windowLengthDurationMs": -5}, "Window length must be positive [-5]"),
        (
            {"windowLengthCount": 5, "slidingIntervalCount": -1},
            "Sliding interval must be positive [-1]",
        ),
        (
            {"windowLengthDurationMs": 5, "slidingIntervalDurationMs": 0},
            "Sliding interval must be positive [0]",
        ),
        (
            {"windowLengthCount": 1, "timestampExtractorClassName": "a.B", "maxLagMs": -1},
            "Lag duration must be positive [-1]",
        ),
        (
            {
                "windowLengthCount": 1,
                "timestampExtractorClassName": "a.B",
                "watermarkEmitIntervalMs": 0,
            },
            "Watermark interval must be positive [0]",
        ),
        (
            {"windowLengthCount": 1, "lateDataTopic": "late"},
            "Late data topic can be defined only when specifying a timestamp extractor class",
        ),
        (
            {"windowLengthCount": 1, "windowLenghtCount": 2},
            "windowConfig.windowLenghtCount: unknown field",
        ),
    ],
)
def test_bad_window_configs_are_refused_with_pulsars_messages(
    window: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidFunctionConfigError) as error:
        parse(window)
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"processingGuarantees": "MANUAL"}, "Windows Function not support MANUAL delivery"),
        (
            {"processingGuarantees": "EFFECTIVELY_ONCE"},
            "Windows Function not support EFFECTIVELY_ONCE delivery",
        ),
        ({"py": None, "js": "w.js"}, "window functions are Python functions"),
    ],
)
def test_window_functions_refuse_what_they_cannot_honour(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidFunctionConfigError) as error:
        parse({"windowLengthCount": 10}, **fields)
    assert message in str(error.value)


def test_late_data_topic_may_not_be_an_input() -> None:
    window = {"windowLengthCount": 1, "timestampExtractorClassName": "a.B", "lateDataTopic": "in"}
    with pytest.raises(InvalidFunctionConfigError, match="lateDataTopic 'in' is also an input"):
        parse(window)


def test_checkpoint_round_trip() -> None:
    checkpoint = Checkpoint(
        fingerprint="10/None/10/None/False",
        engine=EngineState(counter=3, reference=1700, delta=-2, next_window_end=40),
        watermark=35,
        newest={"persistent://public/default/in": 39},
        buffered=[
            Buffered("persistent://public/default/in", (7, 12, -1), 1690, True),
            Buffered("persistent://public/default/in2", (8, 0, 3), 1695, False),
        ],
        done={"persistent://public/default/in": [[(7, 1, -1), (7, 11, -1), 1699]]},
    )
    assert Checkpoint.decode(checkpoint.encode()) == checkpoint
    with pytest.raises(ValueError, match="not a window checkpoint"):
        Checkpoint.decode(b'{"version": 1}')
    with pytest.raises(ValueError, match="unknown checkpoint version"):
        Checkpoint.decode(b'{"version": 99}')


def test_done_runs_hold_exactly_the_positions_added() -> None:
    runs = DoneRuns()
    for position in [(7, 1, -1), (7, 2, -1), (7, 3, 0), (7, 3, 1), (7, 4, -1), (7, 9, -1)]:
        runs.add("t", position, now_ms=1000)
    assert ("t", (7, 3, 1)) in runs
    assert ("t", (7, 9, -1)) in runs
    assert ("t", (7, 5, -1)) not in runs  # never added: 9 did not follow 4
    assert ("t", (7, 10, -1)) not in runs
    assert ("other", (7, 2, -1)) not in runs
    assert runs.pruned(1000 + 29_000) == {
        "t": [[(7, 1, -1), (7, 4, -1), 1000], [(7, 9, -1), (7, 9, -1), 1000]]
    }
    assert runs.pruned(1000 + 31_000) == {}


def test_checkpoints_wait_for_their_chunks_and_only_the_newest_ready_is_written() -> None:
    queue = CheckpointQueue()
    checkpoints = [Checkpoint(str(i), EngineState(counter=i), 0, {}, []) for i in range(3)]
    first, second = Chunk(), Chunk()
    queue.track(first)
    queue.add(checkpoints[0], ["a"], ("in", "id-a"))
    queue.track(second)
    queue.add(checkpoints[1], ["b"], ("in", "id-b"))
    assert queue.ready() == (None, [], None)
    assert second.on_settled is not None and first.on_settled is not None
    second.on_settled(second)
    assert queue.ready() == (None, [], None)  # the first chunk is not persisted yet
    first.on_settled(first)
    assert queue.ready() == (checkpoints[1], ["a", "b"], ("in", "id-b"))
    assert queue.written == checkpoints[1]

    failures: list[Chunk] = []
    queue.on_failure = failures.append
    third = Chunk()
    queue.track(third)
    queue.add(checkpoints[2], ["c"], ("in", "id-c"))
    assert third.on_settled is not None
    third.error = "send failed: Timeout"
    third.on_settled(third)
    assert failures == [third]
    assert queue.ready() == (None, [], None)  # its outputs may be lost: never written
    queue.reset()
    assert queue.written == checkpoints[1]


def test_window_flags_make_the_window_config() -> None:
    from magnetar.cli.function_flags import config_from_flags

    config = config_from_flags(
        None,
        py="w.py",
        inputs="in",
        window_length_duration_ms=1000,
        sliding_interval_duration_ms=250,
        timestamp_extractor_class_name="magnetar.instance.windowing.EventTime",
        max_lag_ms=50,
        watermark_emit_interval_ms=100,
        late_data_topic="late",
    )
    assert config.window_config is not None
    assert config.window_config.model_dump(by_alias=True, exclude_none=True) == {
        "windowLengthDurationMs": 1000,
        "slidingIntervalDurationMs": 250,
        "timestampExtractorClassName": "magnetar.instance.windowing.EventTime",
        "maxLagMs": 50,
        "watermarkEmitIntervalMs": 100,
        "lateDataTopic": "late",
    }
