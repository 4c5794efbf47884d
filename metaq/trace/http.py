"""The HTTP port's trace route (docs/operating.md "Where is my message"; the lookup is ``trace/service.py``):

=================================================  ===============================================================
``GET /api/trace?id=<id>[&topic=T][&max=N]``       a message by id: a metaq id (with its topic), a RocketMQ offset
                                                   id, or a client's msgId (``UNIQ_KEY``, with its topic)
``GET /api/trace?key=<key>&topic=T[&max=N]``       the newest messages of the topic carrying the key
=================================================  ===============================================================

Any authenticated user may ask; the answer is about messages of topics the user may subscribe to (403 otherwise,
the one permission decision, ``Guard.require``). ``max``: 1 to ``limits.TRACE_MAX_RESULTS`` (default: that). The
JSON is the text ``trace`` reply's (``trace/wire.py``); 404 for no such message, 400 for a malformed id.
"""

from metaq import errors
from metaq.trace import limits as trace_limits
from metaq.protocol.httpreply import READ, json_response
from metaq.trace.wire import TraceQuery


class TraceViews:
    """``tracer``: the broker's ``trace.service.Tracer``; ``guard``: the permission decision."""

    def __init__(self, tracer, guard):
        self.tracer = tracer
        self.guard = guard

    def trace(self, request):
        msg_id, key = request.arg("id"), request.arg("key")
        if (msg_id is None) == (key is None):
            raise errors.ClientError("give id=<message id> or key=<key> (with topic=<topic>), one of them")
        most = request.arg("max", trace_limits.TRACE_MAX_RESULTS, int)
        if not 1 <= most <= trace_limits.TRACE_MAX_RESULTS:
            raise errors.ClientError("max=%d: a trace answers 1 to %d messages (limits.TRACE_MAX_RESULTS)"
                                     % (most, trace_limits.TRACE_MAX_RESULTS))
        query = TraceQuery("id" if key is None else "key", msg_id if key is None else key, request.arg("topic"),
                           most, 0)
        return json_response(self.tracer.trace(query, self.guard, request.session))


def add_trace_routes(router, views):
    router.add("GET", "/api/trace", READ, views.trace)
