"""Issue 42, point 2: one user's new idempotent producers never evict another user's window (docs/security.md
"Quotas"). Real brokers with authentication on; the producers pipeline put_idem (the burst path) and resend
alone (the general path)."""

import glob
import os

import pytest

from metaq.auth import limits as auth_limits
from metaq.idempotence import limits as idempotence_limits
from metaq.timers import limits as timers_limits
from metaq.client.local import free_port, rmq_config, small_config
from metaq.client.raw import RemotingClient
from metaq.idempotence.wire import IdempotentPut
from metaq.protocol import events as ev
from metaq.protocol import stats as stats_codec
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.rocketmq.remoting import ResponseCode
from metaq.protocol.text import serialize
from tests.harness.acl import DEFAULT_ROLES, DEFAULT_USERS, SECRETS, login, secured_config, write_acl
from tests.harness.broker import wait_for
from tests.harness.http import request, with_http
from tests.harness.rocketmq import send_v1
from tests.harness.timers import put_at
from tests.harness.replication import master_config

pytestmark = pytest.mark.integration

REPLICATION_SECRET = "replication-secret-0123456789abcdef"


def idem(pid, seq, opaque, topic="orders"):
    body = b"p%d-s%d" % (pid, seq)
    return IdempotentPut(topic, 0, 0, body, opaque, metaq_checksum(body), pid, seq)


def pipeline(c, puts):
    """Send ``puts`` in one write (the broker's burst path) and read every reply."""
    c.send(b"".join(serialize(p) for p in puts))
    return [c.read_event() for _ in puts]


def held(broker, quota="idempotent_producers"):
    """``{user: (held, quota)}`` from ``stats quotas`` (an admin's)."""
    with login(broker, "admin") as admin:
        rows = stats_codec.parse_quotas(admin.stats("quotas").encode())
    return {r.user: (r.used, r.limit) for r in rows if r.quota == quota}


def users():
    both = dict(DEFAULT_USERS)
    both["bob"] = dict(both["bob"], topics={"orders": "pub|sub"})
    return both


def test_another_users_window_survives_4100_fresh_producers_of_one_user(broker_factory, tmp_path):
    """The finding: 4,100 pipelined put_idem with fresh producer ids from alice evicted bob's window, whose resend
    was then stored twice. Now alice's own oldest windows go (her quota: half the table), bob's stays, and alice's
    evicted producer is told why instead of storing a second copy."""
    b = broker_factory(with_http(secured_config(tmp_path, users=users()), open_metrics=False))
    bob = login(b, "bob")
    assert bob.call(idem(900, 0, 1)).code == 200
    alice = login(b, "alice")
    n = idempotence_limits.MAX_IDEMPOTENT_PRODUCERS + 4
    replies = pipeline(alice, [idem(10_000 + i, 0, i) for i in range(n)])
    assert [r.code for r in replies] == [200] * n
    quota = int(idempotence_limits.MAX_IDEMPOTENT_PRODUCERS * auth_limits.QUOTA_DEFAULT_SHARE)
    assert held(b) == {"alice": (quota, quota), "bob": (1, quota), "admin": (0, quota), "reader": (0, quota)}
    r = bob.call(idem(900, 0, 2))  # bob's retried send: a duplicate, not a second copy
    assert r.code == 200 and r.body.endswith(b" dup"), r
    r = alice.call(idem(10_000, 0, 3))  # alice's oldest was evicted: a clear answer, nothing stored
    assert r.code == 400 and b"quota idempotent_producers (%d windows)" % quota in r.body, r
    assert b"evicted" in r.body and b"nothing stored" in r.body
    r = alice.call(idem(10_000 + n - 1, 0, 4))  # her newest is kept
    assert r.code == 200 and r.body.endswith(b" dup"), r
    with login(b, "admin") as admin:
        assert int(admin.stats_dict()["total_messages"]) == n + 1
    with login(b, "alice") as c:  # per user, for admins only
        r = c.call(ev.Stats("quotas", c.opaque()))
        assert r.code == 403 and b"an admin's" in r.body, r
    metrics = request(b, "GET", "/metrics", user="admin", secret=SECRETS["admin"]).text
    assert 'metaq_quota_used{quota="idempotent_producers",user="alice"} %d.0' % quota in metrics
    assert 'metaq_quota_limit{quota="idempotent_producers",user="bob"} %d.0' % quota in metrics
    assert "metaq_quota_used{" not in request(b, "GET", "/metrics", user="bob", secret=SECRETS["bob"]).text
    for c in (alice, bob):
        c.close()


def test_at_the_quota_and_one_past_and_the_owner_kept_across_restarts(broker_factory, tmp_path):
    """Quota 3 for everyone (the file's default): at 3 every window answers its resend, one past evicts alice's
    least recently written only; a restart from the snapshot and one that rebuilds from the log (the owner is
    in the records) give the same answers."""
    cfg = secured_config(tmp_path, users=users())
    write_acl(tmp_path / "acl.yaml", users=users(), quotas={"idempotent_producers": 3})
    b = broker_factory(cfg)
    bob = login(b, "bob")
    assert [r.code for r in pipeline(bob, [idem(900, s, s) for s in range(3)])] == [200] * 3
    alice = login(b, "alice")
    assert [r.code for r in pipeline(alice, [idem(pid, 0, pid) for pid in (1, 2, 3)])] == [200] * 3
    assert held(b)["alice"] == (3, 3)
    assert all(alice.call(idem(pid, 0, 9)).body.endswith(b" dup") for pid in (1, 2, 3))  # at the quota: all kept
    assert alice.call(idem(bob_pid := 900, 5, 10)).code == 400  # bob's producer id is not alice's to write

    assert alice.call(idem(4, 0, 11)).code == 200  # one past: alice's least recently written (1) goes
    assert held(b)["alice"] == (3, 3) and held(b)["bob"] == (1, 3)
    alice.close()
    bob.close()

    def answers(broker):
        with login(broker, "alice") as a, login(broker, "bob") as o:
            return ([a.call(idem(pid, 0, pid)).code for pid in (1, 2, 3, 4)],
                    o.call(idem(bob_pid, 2, 7)).body.endswith(b" dup"), held(broker))

    expected = ([400, 200, 200, 200], True, {"alice": (3, 3), "bob": (1, 3), "admin": (0, 3), "reader": (0, 3)})
    assert answers(b) == expected
    b.stop()
    b.start()  # the snapshot written at the clean stop
    assert answers(b) == expected
    b.stop()
    snapshots = glob.glob(str(tmp_path / "data" / "**" / "producers*"), recursive=True)
    assert snapshots
    for path in snapshots:
        os.unlink(path)
    b.start()  # nothing to trust: rebuilt from the log, each window's owner read from its records
    assert answers(b) == expected


def test_a_slave_applying_replicated_records_keeps_each_users_windows(broker_factory, tmp_path):
    """A slave's table learns the owner from each replicated record: the same windows per user as its master, and
    the same pending timers per user."""
    acl = write_acl(tmp_path / "acl.yaml", users=users(), roles=DEFAULT_ROLES, quotas={"idempotent_producers": 2})
    security = {"acl_file": acl, "replication_secret": REPLICATION_SECRET}
    rport = free_port()
    mcfg = master_config(tmp_path / "m", rport)
    mcfg["security"] = security
    master = broker_factory(mcfg, workdir=tmp_path / "m")
    scfg = small_config(str(tmp_path / "s" / "data"), security=security)
    slave = broker_factory(scfg, workdir=tmp_path / "s",
                           extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    with login(master, "bob") as bob:
        assert bob.call(idem(900, 0, 1)).code == 200
    with login(master, "alice") as alice:
        assert [r.code for r in pipeline(alice, [idem(pid, 0, pid) for pid in range(1, 6)])] == [200] * 5
    expected = {"alice": (2, 2), "bob": (1, 2), "admin": (0, 2), "reader": (0, 2)}
    assert held(master) == expected
    wait_for(lambda: held(slave) == expected, timeout=20, what="the slave's windows per user")
    for user, count in (("alice", 2), ("bob", 1)):  # pending timers: the owner is in each replicated entry too
        with login(master, user) as c:
            for _ in range(count):
                assert put_at(c, "orders", b"later", "+600000").code == 200
    limit = timers_limits.MAX_PENDING_TIMERS // 2
    timers = {"alice": (2, limit), "bob": (1, limit), "admin": (0, limit), "reader": (0, limit)}
    wait_for(lambda: held(master, "timers") == timers, timeout=20, what="the master's timers per user")
    wait_for(lambda: held(slave, "timers") == timers, timeout=20, what="the slave's timers per user")


def test_a_rocketmq_send_counts_in_its_signers_windows(broker_factory, tmp_path):
    """The remoting port passes the user who signed a send: its window is that user's, not another's to write."""
    acl = write_acl(tmp_path / "acl.yaml", users=users(), quotas={"idempotent_producers": 1})
    b = broker_factory(rmq_config(tmp_path / "data", {}, security={"acl_file": acl}))
    port = b.config["remoting"]["port"]
    props = {"METAQ_PID": "5", "METAQ_SEQ": "0"}
    with RemotingClient(port, credentials=("alice", SECRETS["alice"])) as alice, \
            RemotingClient(port, credentials=("bob", SECRETS["bob"])) as bob:
        assert send_v1(alice, "orders", b"a", queue=0, props=props).code == ResponseCode.SUCCESS
        r = send_v1(bob, "orders", b"b", queue=0, props=props)  # alice's producer id: refused, nothing stored
        assert r.code != ResponseCode.SUCCESS and "another user's" in r.remark, r
        assert send_v1(alice, "orders", b"a2", queue=0, props=dict(props, METAQ_PID="6")).code == \
            ResponseCode.SUCCESS  # one past alice's quota of 1: her window of producer 5 goes
        r = send_v1(alice, "orders", b"a", queue=0, props=props)
        assert r.code != ResponseCode.SUCCESS and "quota idempotent_producers (1 windows)" in r.remark, r
    assert held(b)["alice"] == (1, 1) and held(b)["bob"] == (0, 1)


def test_a_rocketmq_timed_send_counts_in_its_signers_timers(broker_factory, tmp_path):
    """A send with RocketMQ 5's TIMER_DELAY_MS is its signer's pending timer: past the quota refused, nothing
    stored; the answered id still names the entry the broker stored (the owner is inside it)."""
    from metaq.protocol.rocketmq.bodies import decode_stored_messages, parse_offset_msg_id
    from metaq.protocol.rocketmq.remoting import RequestCode as R

    acl = write_acl(tmp_path / "acl.yaml", users=users(), quotas={"timers": 1})
    b = broker_factory(rmq_config(tmp_path / "data", {}, security={"acl_file": acl}))
    port = b.config["remoting"]["port"]
    props = {"TIMER_DELAY_MS": "600000"}
    with RemotingClient(port, credentials=("alice", SECRETS["alice"])) as alice, \
            RemotingClient(port, credentials=("bob", SECRETS["bob"])) as bob, \
            RemotingClient(port, credentials=("admin", SECRETS["admin"])) as admin:
        sent = send_v1(alice, "orders", b"later", queue=0, props=props)
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        r = send_v1(alice, "orders", b"later again", queue=0, props=props)  # one past
        assert r.code != ResponseCode.SUCCESS and "quota timers of user alice is 1" in r.remark, r
        assert send_v1(bob, "orders", b"bob's", queue=0, props=props).code == ResponseCode.SUCCESS
        physical = parse_offset_msg_id(sent.ext_fields["msgId"])[2]
        [entry] = decode_stored_messages(admin.call(R.VIEW_MESSAGE_BY_ID, {"offset": physical}).body)
        assert entry.topic == "%TIMER%" and entry.body.endswith(b"later")
    assert held(b, "timers") == {"alice": (1, 1), "bob": (1, 1), "admin": (0, 1), "reader": (0, 1)}
