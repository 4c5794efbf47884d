"""The broker's wall clock: ``now_ms``, the one the server and every feature's service and handlers read.

It sits at the package root, below every package that reads it; protocol, store and the features' state modules
never read it (they are given the time)."""

import time

from metaq import speedups


def now_ms_py():
    """Milliseconds since the Unix epoch, an int."""
    return int(time.time() * 1000)


#: ``now_ms()``: milliseconds since the Unix epoch, an int; the C helper's twin of ``now_ms_py`` when built (one
#: builtin call, read at least once a message).
now_ms = speedups.load("now_ms", now_ms_py)
