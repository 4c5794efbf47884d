"""The broker's wall clock: ``now_ms``, the one every server module reads (protocol, store and the
transactions' state are given the time)."""

import time

from metaq import speedups


def now_ms_py():
    """Milliseconds since the Unix epoch, an int."""
    return int(time.time() * 1000)


#: ``now_ms()``: milliseconds since the Unix epoch, an int; the C helper's twin of ``now_ms_py`` when built (one
#: builtin call, read at least once a message).
now_ms = speedups.load("now_ms", now_ms_py)
