"""Compressed bodies decompressed on arrival, on the event loop in bounded steps (``metaq.protocol.compression``).

A step decompresses at most ``limits.INFLATE_STEP_BYTES``; between two steps the
greenlet yields, so a 4 MiB body (or a zip bomb cut at the body limit) never holds
the loop for more than one step. Decompression is CPU, not a system call that can
stall: a thread hop would cost more than most steps.
"""

import gevent

from metaq import limits
from metaq.protocol.compression import codec_of, inflate_steps

__all__ = ["inflate_body"]


def inflate_body(sys_flag, data, max_bytes):
    """``data`` decompressed as ``sys_flag`` says (``data`` itself when it is not compressed); BadCompressedBody
    when it does not decompress or passes ``max_bytes``."""
    if codec_of(sys_flag) is None:
        return data
    step = limits.INFLATE_STEP_BYTES
    pieces = []
    for piece in inflate_steps(sys_flag, data, max_bytes, step):
        pieces.append(piece)
        if len(piece) >= step:  # more may follow: let the other clients run before the next step
            gevent.sleep(0)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)
