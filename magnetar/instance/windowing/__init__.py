"""Window functions: with a ``windowConfig``, the function's ``process`` receives the list of
a window's values, once per window, and ``context.get_window()`` gives the window's records,
as Apache Pulsar's Java window functions do.

* ``config``: ``WindowConfig``, Pulsar's fields, defaults and validation.
* ``engine``: the windows themselves (Pulsar's WindowManager and policies), deterministic.
* ``window``: ``Window`` and ``WindowRecord``, what the function sees.
* ``extractors``: event time from the inputs (``EventTime``: the messages' own).
* ``deliveries``, ``checkpoint``, ``firing``, ``runner``: the windows in an instance, their
  acknowledgements, and their checkpoint in the state store across restarts.
"""

from magnetar.instance.windowing.config import WindowConfig
from magnetar.instance.windowing.extractors import EventTime
from magnetar.instance.windowing.window import Window, WindowRecord

__all__ = ["EventTime", "Window", "WindowConfig", "WindowRecord"]
