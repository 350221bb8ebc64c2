"""An async function: each input waits on a (simulated) 10 ms service call; with
--max-pending-async-requests N, N calls are in flight at once."""
import asyncio

from pulsar import Function


class AsyncLookup(Function):
    async def process(self, input, context):
        await asyncio.sleep(0.01)  # the service call
        return input + b"!" if isinstance(input, bytes) else input + "!"
