"""What the put path keeps instead of asking per message, kept current by the change that moves it: the replication
mode (a role change), the store's new partitions (a partition made, a topic deleted), the burst writer's and the
counters' bound calls. A broker built in-process, its parts as the broker wires them."""

from types import SimpleNamespace

import gevent
from gevent.event import Event

from metaq.client.local import small_config
from metaq.server.broker import Broker
from metaq.clock import now_ms
from metaq.server.config import load_config
from metaq.serving.longpoll import NEW_PARTITION
from metaq.serving.putpath import ACK_AFTER_REPLICATION, ACK_NOW, PutPath, WriteGate
from metaq.server.stats import BrokerStats


def broker_of(tmp_path, **sections):
    """A broker built, not started (a replication port is named, never bound)."""
    return Broker(load_config(None, small_config(tmp_path / "data", **sections)))


def test_the_replication_mode_follows_each_role_change_between_two_writes(tmp_path):
    """A ``sync`` master's write is acknowledged after replication; the same broker turned slave, then master again,
    answers each next write by its role of then (``Roles.sync_replication``, set where the role changes): a mode
    left from before would acknowledge a master's write before its slave has it, or wait on a slave for nothing."""
    broker = broker_of(tmp_path, replication={"port": 1, "mode": "sync"}, store={"flush": "async"})
    try:
        path, roles, keys = broker.put_path, broker.roles, (("orders", 0),)
        assert roles.sync_replication and path.written(keys, now_ms()) == ACK_AFTER_REPLICATION
        roles.set_role("slave", None)
        assert not roles.sync_replication and path.written(keys, now_ms()) == ACK_NOW
        roles.set_role("master", None)
        assert roles.sync_replication and path.written(keys, now_ms()) == ACK_AFTER_REPLICATION
    finally:
        broker.store.close(now_ms())


def test_an_async_master_stays_async_across_role_changes(tmp_path):
    broker = broker_of(tmp_path, replication={"port": 1, "mode": "async"}, store={"flush": "async"})
    try:
        for role in ("master", "slave", "master"):
            if role != broker.roles.role:
                broker.roles.set_role(role, None)
            assert not broker.roles.sync_replication
            assert broker.put_path.written((("orders", 0),), now_ms()) == ACK_NOW
    finally:
        broker.store.close(now_ms())


def test_the_broker_tells_its_waiters_of_a_new_partition_and_a_deleted_topic_as_they_happen(tmp_path):
    """The store tells the waiters when a partition appears or a topic's go (``on_partitions_made``), so a wake
    asks nothing: a reader of partitions that may not exist yet is woken by the first write of a new topic, and by
    a topic deleted, between two writes; a write to a partition the store held already does not wake it."""
    broker = broker_of(tmp_path, store={"flush": "async"})
    try:
        path, waiters = broker.put_path, broker.waiters
        path.append("orders", 0, 0, b"first", now_ms())
        for change, woken in ((lambda: None, True),  # the partition made above: told, not yet named by a wake
                              (lambda: path.append("orders", 0, 0, b"again", now_ms()), False),
                              (lambda: path.append("fresh", 1, 0, b"new", now_ms()), True),
                              (lambda: broker.topic_admin.delete("orders"), True)):
            ev = Event()
            waiter = gevent.spawn(waiters.wait_any, [NEW_PARTITION], 0.3, ev)
            gevent.sleep(0)  # the wait is registered
            change()
            path.written((("fresh", 1),), now_ms())
            assert ev.is_set() is woken
            waiter.join()
    finally:
        broker.store.close(now_ms())


def test_a_put_path_with_a_registry_still_registers_each_counted_topic():
    """With a registry ``counted`` counts and registers a new topic, as every write's count does; without ZooKeeper
    it counts."""
    registered = []
    registry = SimpleNamespace(registered_topics=set(), topic_created=registered.append)
    stats = BrokerStats()
    path = PutPath(None, stats, None, None, None, WriteGate(), registry=registry)
    path.counted("orders", 3, 30)
    assert registered == ["orders"] and stats.cmd_put == 3
    bare = PutPath(None, stats, None, None, None, WriteGate())
    bare.counted("orders", 2, 20)
    assert stats.cmd_put == 5 and stats.topic_totals["orders"][:2] == [5, 50]


def test_a_bursts_written_is_the_general_one_in_every_mode_but_a_lone_async_master(tmp_path):
    """``PutPath.burst_written`` is ``BrokerWrites.visible`` itself only with ``async`` flush on a master with no
    replication server and no election; in every other mode it is ``written``, whose answer proves it ran: the
    flush's (ACK_AFTER_FLUSH), a slave's copy (ACK_AFTER_REPLICATION). The deliveries run where the records are
    visible now (``async`` flush), before the wake; with ``sync`` flush the flusher's wake makes them visible."""
    from metaq.serving.putpath import ACK_AFTER_FLUSH
    keys = (("orders", 0),)
    for n, (sections, mode) in enumerate((
            ({"store": {"flush": "async"}}, "fast"),
            ({"store": {"flush": "sync"}}, ACK_AFTER_FLUSH),
            ({"store": {"flush": "async"}, "replication": {"port": 1, "mode": "sync"}}, ACK_AFTER_REPLICATION),
            ({"store": {"flush": "async"}, "replication": {"port": 1, "mode": "async"}}, ACK_NOW))):
        broker = broker_of(tmp_path / str(n), **sections)
        try:
            path, delivered = broker.put_path, []
            fast = path.burst_written == path.writes.visible
            assert fast is (mode == "fast") and (fast or path.burst_written == path.written), sections
            assert path.burst_written(keys, now_ms(), None, delivered.append, ("burst",)) == \
                (ACK_NOW if fast else mode)
            assert delivered == ([] if mode == ACK_AFTER_FLUSH else ["burst"])
        finally:
            broker.store.close(now_ms())


def test_a_role_change_or_an_election_between_two_bursts_gives_them_the_general_written(tmp_path):
    """The kept ``burst_written`` is made again by every change the roles' listeners report (``changed``): a lone
    async master turned slave, then a master serving a ``sync`` slave, answers each next burst by its mode of then
    (ACK_AFTER_REPLICATION: the slave must have it); an election attached makes it the general one too. A choice
    kept across the change would acknowledge the replicating master's burst at once."""
    broker = broker_of(tmp_path, store={"flush": "async"})
    try:
        path, roles, keys = broker.put_path, broker.roles, (("orders", 0),)
        assert path.burst_written == path.writes.visible
        roles.set_role("slave", None)
        assert path.burst_written == path.written
        roles.config.replication.port, roles.config.replication.mode = 1, "sync"
        roles.set_role("master", None)
        assert path.burst_written(keys, now_ms()) == ACK_AFTER_REPLICATION
        roles.set_role("slave", None)
        roles.config.replication.port = 0
        roles.set_role("master", None)
        assert path.burst_written == path.writes.visible
        roles.election = SimpleNamespace(lease=None)  # what an election's listener reports as a change
        path.changed()
        assert path.burst_written == path.written
    finally:
        broker.store.close(now_ms())
