"""The broker's wall clock: ``now_ms``, the one every server module reads (protocol, store and the
transactions' state are given the time)."""

import time


def now_ms():
    """Milliseconds since the Unix epoch, an int."""
    return int(time.time() * 1000)
