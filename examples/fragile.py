"""Raises for inputs containing 'boom', to show user exceptions, retries and dead letters."""
from pulsar import Function


class FragileFunction(Function):
    def process(self, input, context):
        if "boom" in input:
            raise ValueError(f"cannot handle {input!r}")
        return input.upper()
