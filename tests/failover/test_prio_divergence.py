"""A priority consumer that read a level a failover then rewrote skips nothing (README "Priorities", "Replication").

As tests/failover/test_divergence.py, on a priority topic: the async master m holds level-1 messages its slave s
never copied (the link is cut), and a priority consumer has read them. m is killed -9 and s promoted: s writes new
level-1 messages at the very offsets the consumer already read on m. Every ``get_prio`` names the record each
level read last (its expects); the broker answers 412 naming the level whose record differs, or 301 below what
the level read, and the consumer takes that level back to the last record both logs hold
(client/priorities.py). Before the expects, the consumer read on from its level-1 offset and skipped the new
messages written below it.
"""

import pytest

from metaq.client.consumer import Consumer
from metaq.client.local import free_port
from tests.client.test_priorities import create
from tests.failover.test_checked_failover import pair, promote
from tests.failover.test_divergence import Deliveries
from tests.harness.broker import wait_for
from tests.harness.faults import KillBroker, LinkProxy
from tests.harness.replication import caught_up, stats

pytestmark = [pytest.mark.fault]

TOPIC = "t-pdiv"
LEVELS = 2
COPIED, UNCOPIED, NEW = 10, 5, 8


def put_level(broker, bodies, level=1):
    """``bodies`` put to ``level`` of partition 0; their offsets."""
    with broker.client() as c:
        out = []
        for body in bodies:
            r = c.put_prio(TOPIC, body, level, partition=0)
            assert r.code == 200, r
            out.append(int(r.body.split()[2]))
        return out


def diverged_pair(broker_factory, tmp_path, own_zk):
    """m (async master) and s (its slave, through a proxy): a level-0 message and COPIED level-1 ones on both, then
    UNCOPIED level-1 ones on m alone (the link cut). Returns ``(m, s, proxy)``."""
    rport = free_port()
    proxy = LinkProxy(("127.0.0.1", rport)).start()
    m, s, _rport, _srport = pair(broker_factory, tmp_path, own_zk.connect, "async", rport, proxy.address)
    with m.client() as c:
        create(c, TOPIC, partitions=1, priorities=LEVELS)
    put_level(m, [b"low"], level=0)
    put_level(m, [b"m-%d" % k for k in range(COPIED)])
    caught_up(m, s)
    proxy.cut()
    wait_for(lambda: stats(s)["replication_link"] == "down", 10, "the slave's link is cut")
    put_level(m, [b"m-%d" % k for k in range(COPIED, COPIED + UNCOPIED)])
    return m, s, proxy


def fail_over(m, s, capsys, new):
    """kill -9 of m, s promoted by force, ``new`` level-1 messages put to s at the offsets of m's uncopied tail."""
    KillBroker(m).inject()
    code, out = promote(capsys, s, force=True)
    assert "now the master" in out, (code, out)
    assert put_level(s, [b"s-%d" % k for k in range(new)]) == list(range(COPIED, COPIED + new))


def consumer_of(own_zk, group, got):
    consumer = Consumer(group, zk_connect=own_zk.connect, long_poll_ms=300, session_timeout=4.0)
    consumer.subscribe(TOPIC, got, priorities=LEVELS)
    consumer.start()
    return consumer


def went_back_to_a_record_both_hold(bodies, caplog):
    """m's level 1 first, then back to a record both logs hold: what is read again is only level-1 messages both
    hold (at most 3x the depth of the divergence), then every new message of s in order; the level-0 message once."""
    level1 = [b for b in bodies if b != b"low"]
    assert bodies.count(b"low") == 1, bodies
    first = [b"m-%d" % k for k in range(COPIED + UNCOPIED)]
    assert level1[:len(first)] == first, bodies
    again, rest = level1[len(first):-NEW], level1[-NEW:]
    assert rest == [b"s-%d" % k for k in range(NEW)], bodies
    assert again == [b"m-%d" % k for k in range(COPIED - len(again), COPIED)], bodies
    assert len(again) <= 3 * UNCOPIED, bodies
    assert any("differs from the one read before" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("written", [NEW, 1])
def test_a_priority_consumer_holding_a_levels_lost_tail_reads_what_the_new_master_wrote_there(
        broker_factory, tmp_path, own_zk, capsys, caplog, written):
    # NEW: the new master wrote past the level's offset, the expect meets another record there (412 naming level
    # 1); 1: the level's offset is past the new master's end (301 "1 <end>"), probed below that end
    m, s, proxy = diverged_pair(broker_factory, tmp_path, own_zk)
    got = Deliveries(hold_at=b"m-%d" % (COPIED + UNCOPIED - 1))
    consumer = consumer_of(own_zk, "g-pdiv-%d" % written, got)
    try:
        assert got.held.wait(60), "the consumer read m's levels: %r" % got.bodies()
        fail_over(m, s, capsys, written)
        got.release.set()
        wait_for(lambda: b"s-%d" % (written - 1) in got.bodies(), 60,
                 lambda: "the new master's messages delivered: got %r" % got.bodies())
        put_level(s, [b"s-%d" % k for k in range(written, NEW)])
        # level 0's one message comes once level 1 has nothing to read: after the new ones, on a loaded machine
        wait_for(lambda: b"s-%d" % (NEW - 1) in got.bodies() and b"low" in got.bodies(), 60,
                 lambda: "every new message delivered: got %r" % got.bodies())
    finally:
        got.release.set()
        consumer.close()
        proxy.close()
    went_back_to_a_record_both_hold(got.bodies(), caplog)


def test_a_priority_consumer_restarted_on_a_level_offset_committed_in_the_lost_tail_reads_the_new_messages(
        broker_factory, tmp_path, own_zk, capsys, caplog):
    m, s, proxy = diverged_pair(broker_factory, tmp_path, own_zk)
    try:
        got = Deliveries()
        first = consumer_of(own_zk, "g-pdiv2", got)
        wait_for(lambda: len(got.bodies()) == 1 + COPIED + UNCOPIED, 60, "the consumer reads m's levels")
        first.close()  # commits level 1's offset COPIED + UNCOPIED, with the id of m's last level-1 message
        fail_over(m, s, capsys, NEW)
        again = Deliveries()
        second = consumer_of(own_zk, "g-pdiv2", again)
        try:
            wait_for(lambda: set(b"s-%d" % k for k in range(NEW)) <= set(again.bodies()), 60,
                     lambda: "the new master's messages delivered after the restart: got %r" % again.bodies())
        finally:
            second.close()
    finally:
        proxy.close()
    # nothing of the new master skipped; what both logs hold may be read again (the committed record is not on s:
    # the level goes back by time, limits.DIVERGENCE_REWIND_MS, and says so); level 0 was committed: not again
    assert again.bodies()[-NEW:] == [b"s-%d" % k for k in range(NEW)]
    assert b"low" not in again.bodies()
    assert any("differs from every record read before" in r.getMessage() for r in caplog.records)
