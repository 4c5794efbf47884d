"""The elected master's in-sync set and lease (insync.py, election.Lease): pure logic, no ZooKeeper."""

import time

import pytest

from metaq.server.replication import limits as replication_limits
from metaq.server.replication.election import _load, members_of
from metaq.server.replication.leadership import Lease
from metaq.server.replication.insync import InSyncSet


def test_a_sync_put_needs_every_member_and_at_least_one():
    s = InSyncSet(me=0, lag_s=2.0)
    assert not s.confirmed(100, {1: 500})  # nobody required: never confirmed (SLAVE_NOT_AVAILABLE)
    s.join(1)
    s.join(2)
    assert not s.confirmed(100, {1: 500})  # member 2 is not connected
    assert not s.confirmed(100, {1: 500, 2: 99})
    assert s.confirmed(100, {1: 500, 2: 100})
    assert s.required() == {1, 2} and s.required() is not s.waiting_for


def test_only_a_slave_holding_everything_acknowledged_may_join():
    s = InSyncSet(me=0, lag_s=2.0)
    s.acknowledged(1000)
    s.acknowledged(400)  # never goes back
    assert s.acked == 1000
    assert not s.may_join(1, 999) and s.may_join(1, 1000)
    assert not s.may_join(0, 5000)  # the master itself
    s.join(1)
    assert not s.may_join(1, 2000)  # already a member


def test_a_member_behind_for_the_lag_or_gone_for_the_lag_is_lagging():
    s = InSyncSet(me=0, lag_s=2.0)
    t = 1000.0
    s.join(1, seen=t)
    s.join(2, seen=t)
    s.sample(100, now=t)
    s.sample(300, now=t + 1.0)
    s.sample(900, now=t + 2.5)
    # 2 s before t+2.5 the master's end was 100 (the sample at t): a member holding 100 is not lagging yet
    assert s.end_lag_ago(now=t + 2.5) == 100
    assert s.lagging({1: 100, 2: 99}, now=t + 2.5) == [2]
    s.seen({1: 100}, now=t + 2.5)
    assert s.lagging({1: 100}, now=t + 1.9) == []  # 2 disconnected, but not for 2 s yet
    assert s.lagging({1: 100}, now=t + 2.5) == [2]  # disconnected since t
    assert s.end_lag_ago(now=t + 3.1) == 300
    assert s.lagging({1: 299, 2: 900}, now=t + 3.1) == [1]
    s.leave(1)
    assert s.required() == {2}


def test_a_member_that_left_comes_back_only_once_clearly_caught_up():
    """No flapping: a member leaves at the lag bound; coming back needs what the master had lag/4 ago."""
    s = InSyncSet(me=0, lag_s=2.0)
    t = 1000.0
    for i in range(31):  # the master's end grows by 100 every 0.1 s
        s.sample(100 * i, now=t + i / 10)
    now = t + 3.0  # the end is 3000 now, was 1000 two seconds ago and 2500 half a second ago
    s.join(1, seen=now)
    assert s.lagging({1: 999}, now=now) == [1] and s.lagging({1: 1000}, now=now) == []
    s.leave(1)
    assert not s.may_join(1, 1000, now)  # enough to stay, not enough to come back
    assert not s.may_join(1, 2499, now) and s.may_join(1, 2500, now)


def test_the_samples_are_bounded():
    s = InSyncSet(me=0, lag_s=10000.0)  # further back than the samples reach
    for i in range(replication_limits.MAX_INSYNC_SAMPLES + 50):
        s.sample(i, now=float(i))
    assert len(s._ends) == replication_limits.MAX_INSYNC_SAMPLES
    # the samples do not reach back far enough: the oldest kept answers (stricter, never laxer)
    assert s.end_lag_ago(now=float(replication_limits.MAX_INSYNC_SAMPLES + 49)) == 50
    young = InSyncSet(me=0, lag_s=5.0)
    young.sample(100, now=1.0)
    young.join(1, seen=1.0)
    assert young.end_lag_ago(now=2.0) is None  # a term younger than the lag: nobody has lagged that long
    assert young.lagging({1: 0}, now=2.0) == [] and young.lagging({1: 0}, now=6.5) == [1]


def test_a_lease_runs_from_the_sending_time_and_a_revocation_ends_it():
    lease = Lease(0.2)
    assert lease.refusal() == "it has not been elected"
    sent = time.monotonic()
    lease.renew(sent)
    assert lease.refusal() is None
    lease.renew(sent - 10)  # a late answer to an old request never shortens it
    assert lease.refusal() is None
    time.sleep(0.25)
    assert "lease expired" in lease.refusal()
    lease.renew(time.monotonic())
    lease.revoke("its ZooKeeper session expired")
    assert lease.refusal() == "its ZooKeeper session expired"


@pytest.mark.parametrize("data, value", [
    (b'{"members": [0, 1]}', {"members": [0, 1]}),
    (b"[1, 2]", None),  # not an object
    (b"\xff", None),
    (b"{", None),
    (None, None),
    (b'{"x": "' + b"a" * replication_limits.MAX_ELECTION_NODE_BYTES + b'"}', None),  # past the limit
])
def test_election_nodes_are_read_defensively(data, value):
    assert _load(data) == value


def test_members_of_ignores_what_is_not_a_member_id():
    assert members_of({"members": [0, "1", True, 2.0, 3]}) == {0, 3}
    assert members_of({"members": "0,1"}) == set() and members_of(None) == set()
    many = {"members": list(range(replication_limits.MAX_GROUP_MEMBERS + 10))}
    assert len(members_of(many)) == replication_limits.MAX_GROUP_MEMBERS


def test_a_renewal_sent_before_a_revocation_does_not_undo_it():
    """A clean stop revokes the lease while a renewal is in flight: its late answer must not bring it back."""
    lease = Lease(5.0)
    generation = lease.generation
    sent = time.monotonic()
    lease.renew(sent, generation)
    lease.revoke("it is stopping (leadership handed over)")
    assert not lease.renew(sent + 0.1, generation)
    assert lease.refusal() == "it is stopping (leadership handed over)"
    assert lease.renew(time.monotonic(), lease.generation) and lease.refusal() is None


def test_the_granted_session_timeout_is_read_from_kazoo_and_its_chatter_stays_quiet():
    import logging

    from metaq.server.registry import GrantedTimeout, kazoo_logger

    granted = GrantedTimeout()
    logger = kazoo_logger(granted)
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    handler = Keep()
    logger.addHandler(handler)
    try:
        logger.log(5, "Session created, session_id: %r session_passwd: %s\n    negotiated session timeout: %s\n"
                   "    connect timeout: %s", 0x1234, "ab", 4000, 4000.0)
        logger.log(5, "Sending request(xid=%s): %s", 7, "Ping()")
        logger.info("Connecting to %s(%s):%s, use_ssl: %r", "127.0.0.1", "127.0.0.1", 1, False)
        logger.warning("Connection dropped: %s", "socket connection broken")
        logger.warning("Session has expired")
    finally:
        logger.removeHandler(handler)
    assert granted.ms == 4000
    # BLATHER never reaches a handler; each retry's lines are DEBUG (the registry says it once, with the reason)
    assert seen == ["Session has expired"]
    assert granted.last_error == "Connection dropped: socket connection broken"
