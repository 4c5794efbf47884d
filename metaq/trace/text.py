"""The text port's ``trace`` (``trace/wire.py``; docs/operating.md "Where is my message"): the lookup of
``trace/service.py`` with the connection's user's read permission, its answer as a JSON body."""

from metaq.protocol.text import encode_result
from metaq.trace.wire import encode_body

NO_WAIT = 0


class TextTrace:
    """``tracer``: the broker's ``trace.service.Tracer``; ``guard``: the one permission decision (the connection's
    user must be allowed to subscribe to each message's topic)."""

    def __init__(self, tracer, guard):
        self.tracer = tracer
        self.guard = guard

    def trace(self, e, conn):
        value = self.tracer.trace(e, self.guard, conn.session)
        return encode_result(200, encode_body(value), e.opaque), NO_WAIT
