"""The extension make builds from native/output_sends (see ``native_sends``)."""

from collections.abc import Callable
from types import NotImplementedType
from typing import Any

class Sender:
    def __init__(self, producer: Any) -> None: ...
    def send_async(
        self, content: Any, callback: Callable[[Any, Any], None] | None, **fields: Any
    ) -> NotImplementedType | None: ...
    def flush_async(self) -> None: ...
