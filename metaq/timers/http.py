"""The HTTP port's timer routes: what ``metaq-admin timers list|cancel`` does (docs/messaging.md "Cancel"), over the
timer service (``timers/service.py``). Both need the ``admin`` permission, as the text commands ``timers`` and
``cancel``.

==================================  ================================================================================
``GET /api/timers``                 pending messages by due time: ``topic`` (else all), ``max`` (at most
                                    ``MAX_TIMER_LIST``); each ``{"id", "due_ms", "topic", "partition", "bytes"}``
``DELETE /api/timers/{id}``         cancel it: 200 ``{"id", "outcome": "cancelled"}`` once the cancel is durable (as a
                                    put), else 404 with ``"outcome"``: ``delivered``, ``cancelled`` (before) or
                                    ``unknown``
==================================  ================================================================================
"""

from metaq import errors
from metaq.auth.acl import ADMIN
from metaq.timers.limits import MAX_TIMER_LIST
from metaq.protocol.text import INT64_MAX, INT64_MIN
from metaq.clock import now_ms
from metaq.protocol.httpreply import json_response
from metaq.timers.records import TIMER_TOPIC


def admin_only(guard, session, params):
    guard.require(session, ADMIN)


class TimerViews:
    """``timers``: the broker's ``TimerService``; ``put_path``: a cancel is answered once durable, as a put."""

    def __init__(self, timers, put_path):
        self.timers = timers
        self.put_path = put_path

    def list(self, request):
        limit = request.arg("max", kind=int)
        limit = MAX_TIMER_LIST if limit is None else limit
        if not 0 < limit <= MAX_TIMER_LIST:
            raise errors.ClientError("max=%d: expected 1..%d" % (limit, MAX_TIMER_LIST))
        rows = self.timers.list(request.arg("topic"), limit)
        return json_response({"timers": [{"id": i, "due_ms": due, "topic": topic, "partition": partition,
                                          "bytes": size} for i, due, topic, partition, size in rows]})

    def cancel(self, request):
        try:
            msg_id = int(request.params["id"])
        except ValueError:
            raise errors.ClientError("message id %r is not a number" % request.params["id"][:64]) from None
        if not INT64_MIN <= msg_id <= INT64_MAX:
            raise errors.ClientError("message id %s: must be %d..%d" % (request.params["id"][:64], INT64_MIN,
                                                                         INT64_MAX))
        path = self.put_path
        path.check_writable()
        now = now_ms()
        outcome, r = self.timers.cancel(msg_id, now)
        if r is None:
            return json_response({"id": msg_id, "outcome": outcome}, status=404)
        path.durable(TIMER_TOPIC, 0, r.log_end, now)
        return json_response({"id": msg_id, "outcome": outcome})


def add_timer_routes(router, views):
    router.add("GET", "/api/timers", admin_only, views.list)
    router.add("DELETE", "/api/timers/{id}", admin_only, views.cancel)
