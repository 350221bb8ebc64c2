"""Loops forever on 'hang' (to show --timeout-ms), echoes anything else."""
import time


def process(input):
    while input == "hang":
        time.sleep(0.01)
    return input
