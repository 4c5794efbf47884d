"""GroupCoordinator against a real ZooKeeper: membership, ownership and rebalance (reference §4, §5.3).

Every simulated consumer has its own KazooClient (session timeout 4 s), like a
separate process. The topic "orders" is published by writing the topics-sub
nodes a broker would write: two brokers x 4 partitions.
"""

import json
import threading
import time

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from metaq import errors
from metaq.client.balance import range_assignment
from metaq.client.cluster import ZkCluster
from metaq.client.group import GroupCoordinator
from tests.harness.broker import wait_for as wait_until

ROOT = "/meta"
GROUP = "billing"
TOPIC = "orders"
OWNERS = "%s/consumers/%s/owners/%s" % (ROOT, GROUP, TOPIC)
IDS = "%s/consumers/%s/ids" % (ROOT, GROUP)
SUB = "%s/brokers/topics-sub/%s" % (ROOT, TOPIC)


class Member:
    """One simulated consumer: its own ZooKeeper session, a coordinator and a log of its callbacks."""

    def __init__(self, group, name, cached):
        self.g = group
        self.id = "%s_%s" % (GROUP, name)
        partitions_of = None
        if cached:  # like the Consumer: partitions from ZkCluster's watched cache
            self.cluster = ZkCluster(group.connect, ROOT, session_timeout=4)
            self.zk = self.cluster.zk
            partitions_of = lambda topic: [str(p) for p in self.cluster.subscribe_partitions(topic)]  # noqa: E731
        else:
            self.cluster = None
            self.zk = KazooClient(hosts=group.connect, timeout=4)
            self.zk.start(timeout=15)
        self.coord = GroupCoordinator(self.zk, ROOT, GROUP, self.id, revoke=self._revoke, assign=self._assign,
                                      partitions_of=partitions_of, rebalance_backoff=0.1, start_timeout=20)
        self.holding = set()

    def holding_parts(self):
        return {p for t, p in self.holding if t == TOPIC}

    def _owner_data(self, key):
        """The owner node's data as this consumer's session sees it (None if absent, '?' if unreachable)."""
        try:
            data, _ = self.zk.get_async("%s/%s" % (OWNERS, key[1])).get(timeout=3)
            return data.decode()
        except NoNodeError:
            return None
        except Exception:  # noqa: BLE001 - disconnected: the test cannot tell
            return "?"

    def _revoke(self, keys):
        seen = {k: self._owner_data(k) for k in keys} if self.zk.connected else {}
        self.g.record(self, "revoke", keys, seen)
        self.g.check(keys <= self.holding, "%s revoked %s, never assigned" % (self.id, sorted(keys - self.holding)))
        self.holding -= keys

    def _assign(self, keys):
        seen = {k: self._owner_data(k) for k in keys}
        self.g.record(self, "assign", keys, seen)
        self.g.check(not keys & self.holding,
                     "%s assigned %s twice without a revoke" % (self.id, sorted(keys & self.holding)))
        self.holding |= keys

    def parts(self):
        return set(self.coord.assignment().get(TOPIC, []))


class Group:
    def __init__(self, connect):
        self.connect = connect
        self.admin = KazooClient(hosts=connect, timeout=10)
        self.admin.start(timeout=15)
        self.members = []
        self.events = []
        self.violations = []  # callback checks that failed: the coordinator catches and logs what a callback raises,
        self.lock = threading.Lock()  # so they are kept here and fail the test at teardown

    def check(self, ok, what):
        if not ok:
            with self.lock:
                self.violations.append(what)

    def publish(self, broker_id, num_parts):
        self.admin.create("%s/%d-m" % (SUB, broker_id),
                          json.dumps({"numParts": num_parts, "broker": "%d-m" % broker_id}).encode(), makepath=True)

    def record(self, member, kind, keys, seen):
        with self.lock:
            self.events.append((member.id, kind, frozenset(keys), seen))

    def join(self, name, cached=False):
        m = Member(self, name, cached)
        self.members.append(m)
        m.coord.start([TOPIC])
        return m

    def owners(self):
        """{partition: owner id} read from ZooKeeper."""
        try:
            children = self.admin.get_children(OWNERS)
        except Exception:  # noqa: BLE001 - no owners yet
            return {}
        result = {}
        for child in children:
            try:
                result[child] = self.admin.get("%s/%s" % (OWNERS, child))[0].decode()
            except Exception:  # noqa: BLE001 - released meanwhile
                pass
        return result

    def balanced(self, members, partitions):
        """Owner nodes and every member's assignment equal the range assignment of ``partitions`` over ``members``."""
        expected = range_assignment([m.id for m in members], partitions)
        owners = self.owners()
        return (all(m.parts() == set(expected[m.id]) == m.holding_parts() for m in members)
                and owners == {p: c for c, ps in expected.items() for p in ps})

    def wait_balanced(self, members, partitions, timeout=15):
        wait_until(lambda: self.balanced(members, partitions), timeout,
                   "balanced over %s: owners %s" % ([m.id for m in members], self.owners()))

    def check_callback_order(self):
        """Revoke saw the owner node still ours (not yet deleted); assign saw it already ours."""
        with self.lock:
            for member_id, kind, _keys, seen in self.events:
                for key, data in seen.items():
                    if data != "?":
                        assert data == member_id, "%s %s of %s saw owner %r" % (member_id, kind, key, data)

    def close(self):
        for m in self.members:
            m.coord.stop(timeout=10)
            if m.cluster is not None:
                m.cluster.close()
            else:
                m.zk.stop()
                m.zk.close()
        self.admin.stop()
        self.admin.close()
        assert not self.violations, "callback checks failed: %s" % self.violations


EIGHT = ["%d-%d" % (b, p) for b in (1, 2) for p in range(4)]


@pytest.fixture
def group(zk_connect):
    g = Group(zk_connect)
    g.publish(1, 4)
    g.publish(2, 4)
    yield g
    g.close()


def test_three_consumers_own_disjoint_partitions_covering_all_and_one_leaving_hands_them_over(group):
    a, b, c = group.join("a"), group.join("b"), group.join("c")
    group.wait_balanced([a, b, c], EIGHT)
    owners = group.owners()
    assert sorted(owners) == sorted(EIGHT)
    assert set(owners.values()) == {a.id, b.id, c.id}
    assert sorted(group.admin.get_children(IDS)) == sorted([a.id, b.id, c.id])
    for m in (a, b, c):
        assert m.coord.wait_stable(5)
        assert group.admin.get("%s/%s" % (IDS, m.id))[0] == b"orders"

    b.coord.stop()
    group.wait_balanced([a, c], EIGHT, timeout=10)  # (a safety net: a stopping member hands over at once)
    assert b.id not in group.admin.get_children(IDS)
    assert b.holding == set()
    group.check_callback_order()


def test_a_consumer_keeps_the_partitions_still_assigned_to_it(group):
    a = group.join("a")
    group.wait_balanced([a], EIGHT)
    before = len(group.events)
    b = group.join("b")
    group.wait_balanced([a, b], EIGHT)
    a_events = [(kind, keys) for mid, kind, keys, _ in group.events[before:] if mid == a.id]
    # a gave away exactly b's share and was never told to stop the partitions it kept
    assert a_events == [("revoke", frozenset((TOPIC, p) for p in b.parts()))]
    group.check_callback_order()


@pytest.mark.fault
def test_a_consumer_that_vanishes_without_stopping_is_replaced_within_the_session_timeout(group):
    a, b, c = group.join("a"), group.join("b"), group.join("c")
    group.wait_balanced([a, b, c], EIGHT)
    c.zk.stop()  # no coordinator.stop(): its ephemeral nodes vanish with the session (4 s)
    group.wait_balanced([a, b], EIGHT, timeout=30)
    assert c.holding == set(), "the coordinator revokes once its session is lost"
    group.check_callback_order()


def test_a_new_broker_in_topics_sub_triggers_a_rebalance(group):
    # b and c take partitions from ZkCluster's cache, which may lag behind the watch that wakes them
    a, b, c = group.join("a"), group.join("b", cached=True), group.join("c", cached=True)
    group.wait_balanced([a, b, c], EIGHT)
    group.publish(3, 4)
    twelve = EIGHT + ["3-%d" % p for p in range(4)]
    group.wait_balanced([a, b, c], twelve, timeout=10)
    group.admin.delete("%s/3-m" % SUB)
    group.wait_balanced([a, b, c], EIGHT, timeout=10)
    group.admin.set("%s/2-m" % SUB, b'{"numParts":6}')  # a config reload changed the count
    group.wait_balanced([a, b, c], EIGHT + ["2-4", "2-5"], timeout=10)
    group.check_callback_order()


def test_revoke_runs_before_the_owner_node_is_deleted_and_assign_after_the_claim(group):
    a = group.join("a")
    group.wait_balanced([a], EIGHT)
    b = group.join("b")
    group.wait_balanced([a, b], EIGHT)
    b.coord.stop()
    group.wait_balanced([a], EIGHT)
    kinds = [(mid, kind) for mid, kind, _, _ in group.events]
    kinds = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]  # b may claim in two steps
    assert kinds == [(a.id, "assign"), (a.id, "revoke"), (b.id, "assign"), (b.id, "revoke"), (a.id, "assign")]
    for mid, kind, keys, seen in group.events:
        assert set(seen) == set(keys) and set(seen.values()) == {mid}, (kind, seen)


def test_start_fails_clearly_when_a_partition_is_never_released(group):
    # a foreign owner (a crashed Java consumer's node that someone made persistent) blocks one partition
    group.admin.create("%s/1-0" % OWNERS, b"billing_ghost", makepath=True)
    reports = []
    zk = KazooClient(hosts=group.connect, timeout=4)
    zk.start(timeout=15)
    try:
        coord = GroupCoordinator(zk, ROOT, GROUP, "billing_x", revoke=lambda k: None, assign=lambda k: None,
                                 rebalance_backoff=0.05, max_attempts=3, start_timeout=2, on_error=reports.append)
        with pytest.raises(errors.Unavailable, match="could not join group 'billing'"):
            coord.start([TOPIC])
        assert reports and isinstance(reports[0], errors.Unavailable)
        assert zk.get_children(IDS) == [] and group.owners() == {"1-0": "billing_ghost"}
    finally:
        zk.stop()
        zk.close()


@pytest.mark.fault
def test_after_session_expiry_the_consumer_re_registers_and_rebalances(group):
    a, b = group.join("a"), group.join("b")
    group.wait_balanced([a, b], EIGHT)
    old_session = a.zk.client_id
    a_had, before = a.parts(), len(group.events)
    # expire a's session the classic way: open the same session elsewhere and close it
    thief = KazooClient(hosts=group.connect, timeout=4, client_id=old_session)
    thief.start(timeout=15)
    thief.stop()
    thief.close()
    wait_until(lambda: a.zk.client_id not in (None, old_session), 15, "a new session")
    group.wait_balanced([a, b], EIGHT, timeout=15)
    a_events = [(kind, keys) for mid, kind, keys, _ in group.events[before:] if mid == a.id]
    # everything revoked first, then claimed again in the new session (maybe in steps, while b lets go)
    assert a_events[0] == ("revoke", frozenset((TOPIC, p) for p in a_had))
    assert {kind for kind, _ in a_events[1:]} == {"assign"}
    assert a.id in group.admin.get_children(IDS)
    # (no check_callback_order: after an expiry the server deleted the owner nodes before anyone could revoke)


@pytest.mark.slow
@pytest.mark.fault
def test_zookeeper_restart_pauses_consumption_then_everything_is_owned_again(own_zk):
    g = Group(own_zk.connect)
    try:
        g.publish(1, 4)
        g.publish(2, 4)
        members = [g.join(n) for n in "abc"]
        g.wait_balanced(members, EIGHT)
        own_zk.stop()
        # unreachable for a whole session timeout: nobody may keep consuming
        wait_until(lambda: all(not m.holding for m in members), 15, "consumers paused")
        own_zk.start()
        wait_until(lambda: all(m.zk.connected for m in members) and g.admin.connected, 20, "reconnected")
        g.wait_balanced(members, EIGHT, timeout=20)
        assert sorted(g.admin.get_children(IDS)) == sorted(m.id for m in members)
        g.check_callback_order()
    finally:
        g.close()



def test_a_lagging_partitions_of_is_re_checked_until_it_catches_up(group):
    known = list(EIGHT)  # a cache that learns about broker 3 only some time after ZooKeeper does
    zk = KazooClient(hosts=group.connect, timeout=4)
    zk.start(timeout=15)
    coord = GroupCoordinator(zk, ROOT, GROUP, "billing_solo", revoke=lambda k: None, assign=lambda k: None,
                             partitions_of=lambda topic: list(known), rebalance_backoff=0.1)
    try:
        coord.start([TOPIC])
        assert coord.assignment() == {TOPIC: sorted(EIGHT)}
        group.publish(3, 2)
        time.sleep(1.0)
        assert coord.assignment() == {TOPIC: sorted(EIGHT)}
        known.extend(["3-0", "3-1"])
        wait_until(lambda: coord.assignment() == {TOPIC: sorted(EIGHT + ["3-0", "3-1"])}, 10, "caught up")
    finally:
        coord.stop()
        zk.stop()
        zk.close()
