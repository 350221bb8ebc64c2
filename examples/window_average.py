"""A window function: the average of each window of numbers, with the window's bounds.

    magnetar functions localrun --py examples/window_average.py --classname window_average \
        --inputs numbers --output averages --window-length-count 10 --sliding-interval-count 5
"""

import json


def process(inputs, context):
    window = context.get_window()
    records = window.get()
    return json.dumps(
        {
            "average": sum(inputs) / len(inputs),
            "count": len(inputs),
            "first": records[0].message_id.entry_id(),
            "last": records[-1].message_id.entry_id(),
            "end": window.get_end_timestamp(),
        }
    )
