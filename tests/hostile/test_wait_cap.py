"""``limits.max_wait_ms`` on both protocols (README "Limits"): a long poll may ask for any wait, the broker holds
it at most ``max_wait_ms``. A wait at the limit is honoured (a message put during it is delivered to it); a wait
far past the limit is cut to it: the poll is answered with "nothing" after the limit, not after what it asked.

No speed is asserted: the clients read with a 60 s timeout while the asked waits are ten minutes, so a broker
that did not cut the wait fails the read; the lower bound (held at least about the limit) is what a busy machine
cannot break.
"""

import threading
import time

from metaq.client.local import rmq_config, small_config
from metaq.client.raw import PULL_FLAGS, RemotingClient, TextClient, pull_fields
from metaq.protocol import events as ev
from metaq.protocol.rocketmq.remoting import RequestCode, ResponseCode
from tests.harness.broker import wait_for

CAP_MS = 1500
ASKED_MS = 600_000  # ten minutes: past the cap by far
SUSPEND = 1 << 1  # PULL_SUSPEND in the pull's sysFlag


def parked(broker):
    with broker.client() as c:
        return int(c.stats_dict()["parked_gets"])


def put_when_parked(broker, topic, body):
    """Put ``body`` once a long poll is parked (in a thread: the caller is blocked reading its poll's answer)."""
    def run():
        wait_for(lambda: parked(broker) == 1, what="the poll to park")
        with broker.client() as c:
            c.put_ok(topic, body, partition=0)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_text_get_waits_at_most_max_wait_ms(broker_factory, tmp_path):
    broker = broker_factory(small_config(tmp_path / "data", limits={"max_wait_ms": CAP_MS}))
    c = TextClient("127.0.0.1", broker.port, timeout=60.0)
    try:
        # at the limit: the wait is honoured, a message put during it is the answer
        t = put_when_parked(broker, "wc", b"during the wait")
        r = c.call(ev.Get("wc", "g", 0, 0, 4096, 1, CAP_MS))
        t.join(30)
        assert type(r) is ev.Value and r.opaque == 1 and r.body.endswith(b"during the wait")
        # far past it: cut to the limit, answered "nothing" (offset 1 is the end of the partition)
        started = time.monotonic()
        r = c.call(ev.Get("wc", "g", 0, 1, 4096, 2, ASKED_MS))
        held = time.monotonic() - started
        assert (r.code, r.opaque) == (404, 2), r
        assert held >= CAP_MS / 1000.0 * 0.9, "answered after %.3f s, before the wait ended" % held
        assert parked(broker) == 0
        # the connection is still served, and the message after the cut wait is not lost
        c.put_ok("wc", b"after", partition=0)
        r = c.call(ev.Get("wc", "g", 0, 1, 4096, 3))
        assert type(r) is ev.Value and r.body.endswith(b"after")
    finally:
        c.close()


def test_remoting_suspended_pull_waits_at_most_max_wait_ms(broker_factory, tmp_path):
    broker = broker_factory(rmq_config(tmp_path / "data", limits={"max_wait_ms": CAP_MS}))
    with RemotingClient(broker.config["remoting"]["port"]) as rc:
        t = put_when_parked(broker, "wcr", b"during the pull")
        r = rc.call(RequestCode.PULL_MESSAGE,
                    pull_fields("wcr", 0, 0, sys_flag=PULL_FLAGS | SUSPEND, suspend_ms=CAP_MS), timeout=60.0)
        t.join(30)
        assert r.code == ResponseCode.SUCCESS and b"during the pull" in r.body
        started = time.monotonic()
        r = rc.call(RequestCode.PULL_MESSAGE,
                    pull_fields("wcr", 0, 1, sys_flag=PULL_FLAGS | SUSPEND, suspend_ms=ASKED_MS), timeout=60.0)
        held = time.monotonic() - started
        assert r.code == ResponseCode.PULL_NOT_FOUND, r
        assert held >= CAP_MS / 1000.0 * 0.9, "answered after %.3f s, before the wait ended" % held
        assert parked(broker) == 0
