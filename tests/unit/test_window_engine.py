"""The window engine on its own, with the clock passed in: the windows Apache Pulsar's
WindowManager and policies fire, for each kind of window, and a restored engine going on
exactly where the checkpointed one was."""

from __future__ import annotations

from typing import Any

from magnetar.instance.windowing import WindowConfig
from magnetar.instance.windowing.engine import Activation, Event, Watermarks, WindowEngine


class Windows:
    """An engine whose windows are recorded as lists of the events' items."""

    def __init__(self, **config: Any) -> None:
        self.activations: list[Activation] = []
        self.engine = WindowEngine(WindowConfig(**config), self.activations.append)

    def add(self, item: Any, now: int, timestamp: int | None = None) -> None:
        self.engine.add(Event(now if timestamp is None else timestamp, item), now)

    def fired(self, part: str = "events") -> list[list[Any]]:
        return [[e.item for e in getattr(a, part)] for a in self.activations]


def test_tumbling_count_window_fires_every_n_and_expires_its_events_at_once() -> None:
    w = Windows(window_length_count=3)
    for i in range(1, 8):
        w.add(i, now=i)
    assert w.fired() == [[1, 2, 3], [4, 5, 6]]
    assert w.fired("expired") == [[], [1, 2, 3]]
    assert [a.end for a in w.activations] == [3, 6]
    assert [a.start for a in w.activations] == [None, None]
    assert [e.item for e in w.engine.take_done()] == [1, 2, 3, 4, 5, 6]
    assert [e.item for e in w.engine.queue] == [7]


def test_sliding_count_window() -> None:
    w = Windows(window_length_count=4, sliding_interval_count=2)
    for i in range(1, 9):
        w.add(i, now=i)
    assert w.fired() == [[1, 2], [1, 2, 3, 4], [3, 4, 5, 6], [5, 6, 7, 8]]
    assert w.fired("new") == [[1, 2], [3, 4], [5, 6], [7, 8]]
    assert w.fired("expired") == [[], [], [1, 2], [3, 4]]
    # what no later window can hold has left already: 5 and 6 are in the next one
    assert [e.item for e in w.engine.queue] == [7, 8]


def test_hopping_count_window_skips_what_falls_between_windows() -> None:
    w = Windows(window_length_count=2, sliding_interval_count=3)
    for i in range(1, 7):
        w.add(i, now=i)
    assert w.fired() == [[2, 3], [5, 6]]
    assert [e.item for e in w.engine.take_done()] == [1, 2, 3, 4, 5, 6]


def test_tumbling_time_window_holds_what_arrived_since_the_last_one_however_late_it_runs() -> None:
    w = Windows(window_length_duration_ms=100)
    w.engine.start(0)
    for at in (10, 50, 99):
        w.add(at, now=at)
    w.engine.tick(99)  # not due yet
    w.engine.tick(100)
    w.add(120, now=120)
    w.add(230, now=230)
    w.engine.tick(250)  # 50 ms late: the next window still starts where this one ended
    w.add(260, now=260)
    w.engine.tick(300)
    assert w.fired() == [[10, 50, 99], [120, 230], [260]]
    assert [(a.start, a.end) for a in w.activations] == [(-1, 99), (149, 249), (199, 299)]
    assert w.engine.next_deadline() == 400


def test_sliding_time_window() -> None:
    w = Windows(window_length_duration_ms=200, sliding_interval_duration_ms=100)
    w.engine.start(0)
    for at, tick in ((50, 100), (150, 200), (250, 300), (350, 400)):
        w.add(at, now=at)
        w.engine.tick(tick)
    assert w.fired() == [[50], [50, 150], [150, 250], [250, 350]]
    assert w.fired("new") == [[50], [150], [250], [350]]


def test_count_window_sliding_by_time_fires_the_last_n_every_interval() -> None:
    w = Windows(window_length_count=2, sliding_interval_duration_ms=100)
    w.engine.start(0)
    for i in (1, 2, 3):
        w.add(i, now=i)
    w.engine.tick(100)
    w.engine.tick(200)  # nothing new: the same last two again, as in Pulsar
    w.add(4, now=210)
    w.engine.tick(300)
    assert w.fired() == [[2, 3], [2, 3], [3, 4]]
    assert w.fired("new") == [[2, 3], [], [4]]


def test_time_window_sliding_by_count() -> None:
    w = Windows(window_length_duration_ms=100, sliding_interval_count=2)
    for at in (0, 10, 150, 160):
        w.add(at, now=at)
    assert w.fired() == [[0, 10], [150, 160]]
    assert [(a.start, a.end) for a in w.activations] == [(-90, 10), (60, 160)]
    assert w.fired("expired") == [[], [0, 10]]


def test_event_time_windows_as_pulsars_window_function_executor_test() -> None:
    # WindowFunctionExecutorTest.testExecuteWithTs: length 20 ms, sliding 10 ms, lag 5 ms
    w = Windows(
        window_length_duration_ms=20,
        sliding_interval_duration_ms=10,
        timestamp_extractor_class_name="x.Extractor",
        max_lag_ms=5,
    )
    watermarks = Watermarks(inputs=1, lag_ms=5, interval_ms=1000)
    watermarks.start(0)
    for ts in (603, 605, 607, 618, 626, 636):
        assert watermarks.track("in", ts)
        w.add(ts, now=0, timestamp=ts)
    assert watermarks.due(999) is None
    watermark = watermarks.due(1000)
    assert watermark == 631
    w.engine.watermark(watermark)
    assert w.fired() == [[603, 605, 607], [603, 605, 607, 618], [618, 626]]
    assert [(a.start, a.end) for a in w.activations] == [(590, 610), (600, 620), (610, 630)]
    assert w.fired("expired") == [[], [], [603, 605, 607]]
    assert not watermarks.track("in", 630)  # older than the watermark: late
    assert watermarks.track("in", 631)


def test_watermark_waits_for_every_input_topic() -> None:
    watermarks = Watermarks(inputs=2, lag_ms=0, interval_ms=10)
    watermarks.start(0)
    watermarks.track("a", 500)
    assert watermarks.due(10) is None  # topic b has had nothing yet
    watermarks.track("b", 300)
    assert watermarks.due(20) == 300
    assert watermarks.due(30) is None  # event time has not advanced


def test_event_time_count_window() -> None:
    w = Windows(
        window_length_count=2,
        sliding_interval_count=2,
        timestamp_extractor_class_name="x.Extractor",
    )
    for ts in (1, 2, 3, 4, 5):
        w.add(ts, now=0, timestamp=ts)
    w.engine.watermark(4)
    assert w.fired() == [[1, 2], [3, 4]]
    assert [a.end for a in w.activations] == [2, 4]
    w.engine.watermark(6)  # 5 is alone past 4: no window of two yet
    assert len(w.activations) == 2


def test_event_time_window_skips_empty_windows_to_the_next_aligned_one() -> None:
    w = Windows(
        window_length_duration_ms=10,
        timestamp_extractor_class_name="x.Extractor",
    )
    for ts in (5, 57, 59):
        w.add(ts, now=0, timestamp=ts)
    w.engine.watermark(100)
    assert w.fired() == [[5], [57, 59]]
    assert [a.end for a in w.activations] == [10, 60]


def test_a_restored_engine_goes_on_as_the_checkpointed_one() -> None:
    config = {"window_length_count": 4, "sliding_interval_count": 2}
    w = Windows(**config)
    for i in range(1, 5):
        w.add(i, now=i)  # windows at 2 and 4: the state a checkpoint keeps
    state = w.engine.state()
    kept = [(e, w.engine.in_last_window(e)) for e in w.engine.queue]
    assert [(e.item, last) for e, last in kept] == [(3, True), (4, True)]
    w.add(5, now=5)  # then the instance dies; 5 was never acknowledged

    restored = Windows(**config)
    restored.engine.restore(state, [(Event(e.timestamp, e.item), last) for e, last in kept])
    for i in (5, 6, 7, 8):  # 5 is delivered again, as new
        restored.add(i, now=i)
    assert restored.fired() == [[3, 4, 5, 6], [5, 6, 7, 8]]
    assert restored.fired("new") == [[5, 6], [7, 8]]
