"""Issue 42, point 2: the count quotas per user a real broker enforces (docs/security.md "Quotas"): connections
logged in as a user, its requests waiting for replies, its consumer offsets, the topics its puts create, its
transactions and its pending timers, each at its value and one past, another user's service
unaffected."""

import json
import subprocess
import sys

import pytest

from metaq.protocol import events as ev
from metaq.protocol.stream import CLOSED
from metaq.protocol import stats as stats_codec
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.text import serialize
from metaq.timers.wire import TimerPut
from metaq.topics.wire import TopicCommand
from tests.harness.acl import DEFAULT_USERS, SECRETS, login, secured_config, write_acl
from tests.harness.broker import url_of, wait_for
from tests.harness.timers import cancel, timers

pytestmark = pytest.mark.integration


def quota_broker(broker_factory, tmp_path, quotas):
    cfg = secured_config(tmp_path)
    write_acl(tmp_path / "acl.yaml", quotas=quotas)
    return broker_factory(cfg)


def used(broker, quota):
    with login(broker, "admin") as admin:
        rows = stats_codec.parse_quotas(admin.stats("quotas").encode())
    return {r.user: (r.used, r.limit) for r in rows if r.quota == quota}


def test_connections_at_the_quota_and_one_past(broker_factory, tmp_path):
    b = quota_broker(broker_factory, tmp_path, {"connections": 2})
    first, second = login(b, "alice"), login(b, "alice")  # at the quota
    assert used(b, "connections")["alice"] == (2, 2)
    third = b.client()
    r = third.auth("alice", SECRETS["alice"])  # one past: refused, naming the quota, and hung up
    assert r.code == 400 and b"quota connections of user alice is 2" in r.body, r
    assert third.read_event() is CLOSED  # the broker hung up
    third.close()
    with login(b, "bob") as bob:  # another user: served
        assert bob.call(ev.Put("orders", 0, 0, b"x", 1, metaq_checksum(b"x"))).code == 200
    first.close()  # a closed connection leaves the count
    wait_for(lambda: used(b, "connections")["alice"] == (1, 2), what="alice's closed connection uncounted")
    with login(b, "alice") as again:
        assert again.call(ev.Put("orders", 0, 0, b"y", 2, metaq_checksum(b"y"))).code == 200
        secret = tmp_path / "admin.secret"
        secret.write_text(SECRETS["admin"])
        secret.chmod(0o600)
        out = subprocess.run([sys.executable, "-m", "metaq.admincli", "--brokers", url_of(b), "--user", "admin",
                              "--secret-file", str(secret), "--json", "quotas", "alice"],
                             capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert out.returncode == 0, out.stderr
        rows = {r["quota"]: (r["used"], r["limit"]) for r in json.loads(out.stdout)}
        assert rows["connections"] == (2, 2) and rows["idempotent_producers"] == (0, 2048)  # metaq-admin shows them
    second.close()


def test_requests_waiting_for_replies_at_the_quota_and_one_past(broker_factory, tmp_path):
    b = quota_broker(broker_factory, tmp_path, {"request_waiters": 2})

    def request(opaque, timeout_ms=30_000):
        body = b"q%d" % opaque
        return ev.Request("orders", 0, 0, body, opaque, metaq_checksum(body), timeout_ms)

    alice = login(b, "alice")
    alice.send(b"".join(serialize(request(n)) for n in (1, 2, 3)))  # two wait (at the quota), the third is one past
    r = alice.read_event()
    assert r.code == 400 and r.opaque == 3 and b"quota request_waiters of user alice is 2" in r.body, r
    assert used(b, "request_waiters")["alice"] == (2, 2)
    users = dict(DEFAULT_USERS)
    assert "orders" in str(users["bob"]["topics"])
    with login(b, "bob") as bob:  # another user's request still waits for its reply (504 at its timeout, not 400)
        r = bob.call(request(7, timeout_ms=300))
        assert r.code == 504, r
    alice.close()


def test_consumer_offsets_at_the_quota_and_one_past_kept_across_a_restart(broker_factory, tmp_path):
    b = quota_broker(broker_factory, tmp_path, {"consumer_offsets": 2})
    with login(b, "admin") as admin:
        for topic, p in (("orders", 0), ("orders", 1), ("orders-b", 0)):
            assert admin.call(ev.Put(topic, p, 0, b"x", p, metaq_checksum(b"x"))).code == 200

    def commit(c, group, partition):
        topic, partition = ("orders", partition) if partition < 2 else ("orders-b", 0)
        return c.call(ev.CommitOffset(group, topic, partition, 1, c.opaque()))

    with login(b, "alice") as alice:
        assert [commit(alice, "billing", p).code for p in (0, 1)] == [200, 200]  # at the quota
        assert commit(alice, "billing", 0).code == 200  # an entry it holds: moved, not counted again
        r = commit(alice, "billing", 2)  # one past
        assert r.code == 400 and b"quota consumer_offsets of user alice is 2" in r.body, r
    with login(b, "admin") as admin:  # another user: served
        assert commit(admin, "audit", 2).code == 200
    assert used(b, "consumer_offsets")["alice"] == (2, 2)
    b.stop()
    b.start()  # the owners are in the state file
    assert used(b, "consumer_offsets")["alice"] == (2, 2)
    with login(b, "alice") as alice:
        assert commit(alice, "billing", 2).code == 400


@pytest.mark.parametrize("quotas, named", [({"topics": 2}, b"quota topics of user alice is 2"),
                                           ({"partitions": 4}, b"quota partitions of user alice is 4")])
def test_topics_and_partitions_a_users_puts_create_at_the_quota_and_one_past(broker_factory, tmp_path, quotas,
                                                                             named):
    """Each topic holds 2 partitions here: 2 topics are at both quotas, a third is one past either."""
    b = quota_broker(broker_factory, tmp_path, quotas)

    def put(c, topic, opaque):
        return c.call(ev.Put(topic, 0, 0, b"x", opaque, metaq_checksum(b"x")))

    with login(b, "alice") as alice:
        assert [put(alice, t, i).code for i, t in enumerate(("orders-1", "orders-2"))] == [200, 200]
        assert put(alice, "orders-1", 3).code == 200  # a topic it created: puts go on
        r = put(alice, "orders-3", 4)
        assert r.code == 400 and named in r.body, r
        alice.send(serialize(ev.Put("orders-1", 0, 0, b"y", 5, metaq_checksum(b"y"))) +
                   serialize(ev.Put("orders-4", 0, 0, b"y", 6, metaq_checksum(b"y"))))  # the burst path too
        assert [alice.read_event().code for _ in range(2)] == [200, 400]
    with login(b, "bob") as bob:  # another user creates its topic
        assert put(bob, "orders", 7).code == 200
    assert used(b, "topics")["alice"] == (2, quotas.get("topics", 512))
    b.stop()
    b.start()  # the owners are in the topic_owners state file
    with login(b, "alice") as alice:
        assert put(alice, "orders-3", 8).code == 400
    with login(b, "admin") as admin:  # a deleted topic leaves its creator's count
        assert admin.call(TopicCommand("delete", "orders-2", (), admin.opaque())).code == 200
    with login(b, "alice") as alice:
        assert put(alice, "orders-3", 9).code == 200


def test_transactions_at_the_quota_and_one_past(broker_factory, tmp_path):
    from metaq.transactions.wire import XAER_RMERR, parse_xa_error
    from tests.harness.tx import ok, tx

    b = quota_broker(broker_factory, tmp_path, {"transactions": 2})
    alice = login(b, "alice")
    for n in (1, 2):  # at the quota: a local transaction and an XA branch
        key = "TX:s1:%d" % n if n == 1 else "XID:1:0a%02d:b1:rm" % n
        ok(tx(alice, key, "BEGIN", 30, None if n == 1 else "rm"))
    r = tx(alice, "XID:1:0a03:b1:rm", "BEGIN", 30, "rm")  # one past: refused, naming the quota
    assert r.code == 500 and parse_xa_error(r.body)[0] == XAER_RMERR, r
    assert b"quota transactions of user alice is 2" in r.body, r
    assert used(b, "transactions")["alice"] == (2, 2)
    with login(b, "bob") as bob:  # another user begins his own
        ok(tx(bob, "XID:1:0b01:b1:rm", "BEGIN", 30, "rm"))
    ok(tx(alice, "TX:s1:1", "ROLLBACK"))  # one ended: room again
    ok(tx(alice, "XID:1:0a03:b1:rm", "BEGIN", 30, "rm"))
    alice.close()


def _put_at(opaque, when="+600000", topic="orders"):
    return TimerPut(topic, 0, 0, b"t%d" % opaque, opaque, metaq_checksum(b"t%d" % opaque), when)


def test_pending_timers_at_the_quota_and_one_past_kept_across_a_restart(broker_factory, tmp_path):
    b = quota_broker(broker_factory, tmp_path, {"timers": 2})
    with login(b, "alice") as alice:
        alice.send(b"".join(serialize(_put_at(n)) for n in (1, 2, 3)))  # pipelined: the burst path's way in
        replies = [alice.read_event() for _ in range(3)]
        assert [r.code for r in replies] == [200, 200, 400], replies  # at the quota, then one past
        assert b"quota timers of user alice is 2" in replies[2].body
        ids = [int(r.body.split()[0]) for r in replies[:2]]
    with login(b, "bob") as bob:  # another user: served
        assert bob.call(_put_at(7)).code == 200
    assert used(b, "timers")["alice"] == (2, 2)
    with login(b, "admin") as admin:  # one cancelled (an admin's command) makes room
        assert cancel(admin, ids[0]) == (200, "cancelled")
    wait_for(lambda: used(b, "timers")["alice"] == (1, 2), what="alice's cancelled timer uncounted")
    with login(b, "alice") as alice:
        assert alice.call(_put_at(4)).code == 200
        assert alice.call(_put_at(5)).code == 400
    b.stop()
    b.start()  # the owner is in each entry and timers.db counts them
    assert used(b, "timers")["alice"] == (2, 2)
    with login(b, "alice") as alice:
        r = alice.call(_put_at(6))
        assert r.code == 400 and b"quota timers of user alice is 2" in r.body, r
    with login(b, "admin") as admin:  # nothing was stored past the quota
        wait_for(lambda: len(timers(admin)) == 3, what="the three timers indexed")


def test_the_broker_wide_bound_of_pending_timers_and_one_past(broker_factory, tmp_path):
    from metaq.client.local import small_config

    b = broker_factory(small_config(tmp_path / "data", limits={"max_pending_timers": 3}))
    c = b.client()
    c.send(b"".join(serialize(_put_at(n, topic="t")) for n in (1, 2, 3, 4)))
    replies = [c.read_event() for _ in range(4)]
    assert [r.code for r in replies] == [200, 200, 200, 503], replies
    assert b"limits.max_pending_timers" in replies[3].body
    wait_for(lambda: len(timers(c)) == 3, what="the three timers indexed")
    assert c.call(ev.Put("t", 0, 0, b"x", 9, metaq_checksum(b"x"))).code == 200  # a plain put is not a timer
    c.close()
