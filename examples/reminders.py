"""Timers: each input arms, re-arms or cancels a reminder; a reminder's callback returns the
output. Inputs are JSON commands:

* ``{"arm": "r1", "at": <epoch s>, "note": "..."}``: remind at ``at`` (re-arming replaces);
* ``{"cancel": "r1"}``: cancel it (the output says whether one was pending);
* ``{"every": "tick", "seconds": 0.5, "times": 3}``: a recurring reminder, fired 3 times.
"""

import json
import time

from pulsar import Function


class Reminders(Function):
    def process(self, input, context):
        command = json.loads(input)
        if "arm" in command:
            note = {"reference": command["arm"], "note": command.get("note")}
            context.create_timer(self.remind, command["at"], command["arm"], note)
            return None
        if "cancel" in command:
            return json.dumps(
                {
                    "cancelled": command["cancel"],
                    "was_pending": context.cancel_timer(command["cancel"]),
                }
            )
        every = {
            "reference": command["every"],
            "seconds": command["seconds"],
            "left": command["times"],
        }
        context.create_timer(self.tick, time.time() + every["seconds"], every["reference"], every)
        return None

    def remind(self, payload, context):
        context.incr_counter("reminded", 1)
        return json.dumps(
            {"fired": payload["reference"], "note": payload["note"], "at": time.time()}
        )

    def tick(self, payload, context):
        fired_at = time.time()  # the next tick is due an interval after this one fired
        left = payload["left"] - 1
        if left > 0:  # recurring: the callback arms the same reference again
            again = {**payload, "left": left}
            context.create_timer(
                self.tick, fired_at + payload["seconds"], payload["reference"], again
            )
        return json.dumps({"fired": payload["reference"], "left": left, "at": fired_at})
