"""A text ``request`` waiting for its reply holds none of its bytes (found by an attack review: 150 waiting
requests of 4 MiB held 1.3 GB for their whole timeout). Over fakes of the put path and the router: no network."""

import sys
import types

from metaq.reqreply.text import TextRequests


class Path:
    def append(self, topic, partition, flag, data, now, checksum=None):
        return types.SimpleNamespace(partition=partition, log_end=len(data))

    def durable(self, topic, partition, log_end, now):
        pass


def others(obj):
    """References to ``obj`` besides the test's own name for it (a closure cell), this function's and
    getrefcount's arguments."""
    return sys.getrefcount(obj) - 3


def test_the_wait_for_a_reply_holds_neither_the_request_nor_its_stored_bytes():
    body = bytes(1 << 20)
    data = b"with properties " + body
    seen = {}

    class Router:
        def wait(self, correlation_id, waiter, timeout_s):
            seen["request"], seen["data"] = others(e), others(data)
            return None  # no reply in time

        def cancel(self, correlation_id):
            pass

    requests = TextRequests(Router(), Path(), None, 1000, None, 1 << 20)
    e = types.SimpleNamespace(topic="t", partition=0, opaque=7, body=body)
    job = [e, 0, data]
    reply = requests._serve(job, None, "c-1", None, 1000)
    assert b"504" in reply and b"no reply within 1000 ms" in reply
    assert job == [] and seen == {"request": 0, "data": 0}, seen  # the waiting greenlet holds neither
