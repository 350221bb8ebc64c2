"""A custom SerDe and a function over the objects it makes (Apache's custom_object_function
convention)."""

from pulsar import Function, SerDe


class Pair:
    def __init__(self, a, b):
        self.a = a
        self.b = b


class PairSerDe(SerDe):
    def serialize(self, pair):
        return f"{pair.a},{pair.b}".encode()

    def deserialize(self, input_bytes):
        a, b = input_bytes.decode().split(",")
        return Pair(int(a), int(b))


class Shift(Function):
    def process(self, input, context):
        return Pair(input.a + 11, input.b + 24)
