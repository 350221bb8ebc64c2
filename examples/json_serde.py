"""A custom SerDe (JSON) and a function that uses it: doubles the 'amount' of an order."""
import json

from pulsar import Function, SerDe


class JsonSerDe(SerDe):
    def serialize(self, input):
        return json.dumps(input, sort_keys=True).encode("utf-8")

    def deserialize(self, input_bytes):
        return json.loads(input_bytes)


class DoubleAmountFunction(Function):
    def process(self, input, context):
        return {**input, "amount": input["amount"] * 2}
