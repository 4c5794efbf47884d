"""Issue 15 point 3 against a real broker started under a low RLIMIT_NOFILE (1024, soft and hard: the machine allows
no more, and the connection cap is then 1024 - FD_RESERVE = 512): idle connections up to the cap plus a burst of 600
new-topic puts never put the broker into the sticky "failed flush, restart the broker" state; writes keep working at
the cap, a connection past it gets the clear refusal, and once the connections go everything is normal without a
restart."""

import os

from metaq import limits
from metaq.client.local import small_config
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.stream import CLOSED
from metaq.protocol.text import serialize
from tests.harness.broker import under_nofile, wait_for

NOFILE = 1024


def open_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def test_idle_connections_to_the_cap_and_a_new_topic_burst_under_a_low_fd_limit(broker_factory, tmp_path):
    cap = NOFILE - limits.FD_RESERVE
    # every test connection comes from 127.0.0.1: let one address take the whole cap
    b = broker_factory(small_config(tmp_path / "data", limits={"max_connections_per_address": cap}), start=False)
    under_nofile(b, NOFILE, NOFILE).start()
    conns = []
    try:
        while True:  # idle connections until the broker refuses one
            c = b.client()
            r = c.call(ev.Version(len(conns)))
            if r.code != 200:
                assert r.code == 503 and b"too many connections" in r.body
                c.close()
                break
            conns.append(c)
            assert len(conns) <= cap
        assert len(conns) == cap

        # a burst of 600 puts, each creating a topic, pipelined on one of them (at the cap)
        worker = conns[0]
        burst = b"".join(serialize(ev.Put("burst-%d" % i, 0, 0, b"m%d" % i, 1000 + i, metaq_checksum(b"m%d" % i)))
                         for i in range(600))
        worker.send(burst)
        replies = [worker.read_event() for _ in range(600)]
        codes = [r.code for r in replies]
        assert codes == [200] * 600, [(i, r) for i, r in enumerate(replies) if r.code != 200][:3]
        store_fds = open_fds(b.proc.pid) - cap
        assert store_fds < limits.FD_RESERVE // 4, store_fds  # what the store and the rest hold fits the reserve

        # writes keep working at the cap, on any connection; one more connection is refused cleanly
        for i, c in enumerate(conns[1:50]):
            c.put_ok("burst-%d" % i, b"again", partition=0)
        with b.client() as extra:
            r = extra.read_event()
            assert r.code == 503 and b"too many connections" in r.body
            assert extra.read_event() is CLOSED
    finally:
        for c in conns:
            c.close()

    # the attacker left: everything is normal, no restart (once the broker has read the closes)

    def all_closed():
        with b.client() as probe:  # refused (503) while the broker still counts the cap
            return probe.call(ev.Version(0)).code == 200 and probe.stats_dict()["curr_connections"] == "1"

    wait_for(all_closed, what="the attacker's connections closed")
    with b.client() as c:
        c.put_ok("after-%d" % 1, b"new topic after", partition=0)
        for i in (0, 299, 599):
            got = [rec.data for rec in c.get_records("burst-%d" % i, 0, 0)]
            assert got[0] == b"m%d" % i
        assert [rec.data for rec in c.get_records("burst-7", 0, 0)] == [b"m7", b"again"]
    assert "restart the broker" not in b.log_text() and "flush failed" not in b.log_text()
    assert b.proc.poll() is None
