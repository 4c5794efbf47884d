"""Test helpers over a real broker: wait for a condition, a broker's URL, read a whole partition, start one under
a lower open-files limit."""

import resource
import time

from metaq.protocol import events as ev
from metaq.protocol.message import iter_records


def url_of(broker):
    """``meta://127.0.0.1:<port>`` of a running BrokerProcess."""
    return "meta://127.0.0.1:%d" % broker.port


def wait_for(predicate, timeout=15.0, what="condition", interval=0.05):
    """The first truthy value of ``predicate()`` within ``timeout`` s; AssertionError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError("not within %.0f s: %s" % (timeout, what() if callable(what) else what))
        time.sleep(interval)


def consume_all(client, topic, partition, start=0, max_size=1 << 20):
    """Every record of a partition from ``start`` to its end, following 301s."""
    out, offset = [], start
    while True:
        r = client.get(topic, partition, offset, max_size)
        if isinstance(r, ev.Result):
            if r.code == 404:
                return out
            if r.code == 301:
                offset = int(r.body)
                continue
            raise AssertionError(r)
        recs = [rec for rec, _ in iter_records(r.body)]
        assert recs, r
        out.extend(recs)
        offset += len(recs)


def under_nofile(broker, soft, hard=None):
    """``broker`` (a BrokerProcess), to be started under a soft RLIMIT_NOFILE of ``soft`` and a hard one of ``hard``
    (None: this process's), set in the child only. A test that means "this machine allows only N" sets both: the
    broker raises its soft limit up to the hard one at start."""
    if hard is None:
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    broker.nofile = (soft, hard)
    return broker
