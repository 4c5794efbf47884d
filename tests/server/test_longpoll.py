"""The long polls' rule against lost wakes (serving/longpoll.py), over a real store in this process: a wait given
the visible end its caller's read saw (``seen``) does not begin when an append was made visible since (that
append's wake went out before the wait began), and waits as before, woken by ``notify``, when none was."""

import time

import gevent
import pytest
from gevent.event import Event

from metaq.protocol.message import encode_payload
from metaq.serving.longpoll import NEW_PARTITION, UNTOLD, PartitionWaiters
from tests.harness.store import NOW, open_store

KEY = ("test", 0)


def put(store, key, payload=b"x"):
    store.put(key[0], key[1], *encode_payload(payload, None), NOW)


def test_a_wait_does_not_begin_when_an_append_came_since_the_read(tmp_path):
    s = open_store(tmp_path / "s")
    w = PartitionWaiters()
    seen = w.ends(s.max_offset, [KEY])  # the caller's read: nothing there
    put(s, KEY)  # made visible, its wake gone out, before the caller waits
    started = time.monotonic()
    assert w.wait(KEY, 30.0, seen, s.max_offset) is True
    assert time.monotonic() - started < 15  # not the 30 s timeout
    assert len(w) == 0  # nothing left registered
    s.close(NOW)


def test_a_wait_with_nothing_appended_since_waits_for_the_wake_or_its_timeout(tmp_path):
    s = open_store(tmp_path / "s")
    w = PartitionWaiters()
    put(s, KEY)
    seen = w.ends(s.max_offset, [KEY])
    started = time.monotonic()
    assert not w.wait(KEY, 0.2, seen, s.max_offset)  # no append since: the whole timeout
    assert time.monotonic() - started >= 0.2

    def append_and_wake():
        put(s, KEY, b"y")
        w.notify((KEY,))

    gevent.spawn_later(0.05, append_and_wake)
    started = time.monotonic()
    assert w.wait(KEY, 30.0, seen, s.max_offset) is True  # an append after the wait began: woken by its notify
    assert time.monotonic() - started < 15
    s.close(NOW)


def test_wait_any_does_not_begin_when_one_of_the_partitions_read_moved(tmp_path):
    s = open_store(tmp_path / "s")
    w = PartitionWaiters()
    keys = [("test", 0), ("test", 1)]
    seen = w.ends(s.max_offset, keys)
    started = time.monotonic()
    assert not w.wait_any(keys, 0.2, Event(), seen, s.max_offset)  # nothing since: its timeout
    assert time.monotonic() - started >= 0.2
    put(s, keys[1])
    started = time.monotonic()
    assert w.wait_any(keys, 30.0, Event(), seen, s.max_offset) is True
    assert time.monotonic() - started < 15
    # a partition left out of ``seen`` is only waited on: its appends wake the wait through ``notify``
    assert not w.wait_any(keys, 0.2, Event(), {keys[0]: seen[keys[0]]}, s.max_offset)
    s.close(NOW)


def test_new_partition_is_woken_once_by_the_first_wake_after_a_partition_appeared(tmp_path):
    """A reader of partitions that may not exist yet waits on NEW_PARTITION: the wake of a new partition's first
    write names it, a later write to a partition the store held already does not."""
    s = open_store(tmp_path / "s")
    w = PartitionWaiters()
    s.on_partitions_made(w.partitions_made)
    ev = Event()
    for key, woken in ((("fresh", 0), True), (("fresh", 0), False), (("other", 0), True)):
        ev.clear()
        gevent.spawn(w.wait_any, [NEW_PARTITION], 0.3, ev)
        gevent.sleep(0)  # the wait is registered
        put(s, key)
        w.notify((key,))
        gevent.sleep(0)
        assert ev.is_set() is woken, key
        gevent.sleep(0.35)  # the wait that was not woken ends
    s.close(NOW)


def test_a_topic_deleted_wakes_the_new_partition_waits_at_once(tmp_path):
    """A topic deleted moves the store's ``partitions_made``, also one none of whose partitions had data; the topic
    admin's ``partitions_changed`` then wakes the NEW_PARTITION waits at once (no append need follow), and once: a
    call without a change since wakes none."""
    s = open_store(tmp_path / "s")
    put(s, ("held", 0))
    s.topics.create("empty", {"partitions": 2})
    w = PartitionWaiters()  # as of now
    s.on_partitions_made(w.partitions_made)
    for topic in ("held", "empty", None):
        ev = Event()
        gevent.spawn(w.wait_any, [NEW_PARTITION], 0.3, ev)
        gevent.sleep(0)  # the wait is registered
        if topic is not None:
            s.topics.delete(topic)
        assert w.partitions_changed() is (topic is not None), topic
        gevent.sleep(0)
        assert ev.is_set() is (topic is not None), topic
        gevent.sleep(0.35)  # the wait that was not woken ends
    s.close(NOW)


def test_a_partition_whose_end_cannot_be_told_is_waited_on_as_before(tmp_path):
    s = open_store(tmp_path / "s")
    w = PartitionWaiters()
    key = ("test", 9)  # past the topic's partitions
    seen = w.ends(s.max_offset, [key])
    assert seen == {key: UNTOLD}
    started = time.monotonic()
    assert not w.wait(key, 0.2, seen, s.max_offset)
    assert time.monotonic() - started >= 0.2
    s.close(NOW)


def test_a_quiet_wait_is_passed_over_by_that_append_and_woken_by_the_next():
    """``notify``'s ``quiet``: a wait that already has what was appended (an MQTT delivery that sent it from the
    publisher's turn) is not woken by that append, stays registered, and the next append wakes it; the other waits
    of the key, and the quiet wait's other keys, are woken as before."""
    w = PartitionWaiters()
    quiet, other = Event(), Event()
    second = ("test", 1)
    waits = [gevent.spawn(w.wait_any, [KEY, second], 5.0, quiet), gevent.spawn(w.wait_any, [KEY], 5.0, other)]
    gevent.sleep(0)
    assert w.notify([KEY], {KEY: {quiet}}) is True
    assert other.is_set() and not quiet.is_set()
    gevent.sleep(0)
    assert waits[1].ready() and not waits[0].ready()
    assert w.notify([second], {KEY: {quiet}}) is True  # quiet for KEY only: an append to its other partition wakes it
    assert quiet.is_set() and waits[0].get(timeout=1) is True
    quiet.clear()
    again = gevent.spawn(w.wait_any, [KEY], 5.0, quiet)
    gevent.sleep(0)
    assert w.notify([KEY], {KEY: {quiet}}) is False  # nobody woken: the quiet one is still waiting
    assert not quiet.is_set() and not again.ready()
    assert w.notify([KEY]) is True  # the next append
    assert again.get(timeout=1) is True
    assert len(w) == 0  # every wait cleaned up after itself


def test_a_cancel_ends_a_wait_at_once_and_leaves_nothing_registered():
    w = PartitionWaiters()
    for waiting in (lambda cancel: w.wait(KEY, 30.0, cancel=cancel),
                    lambda cancel: w.wait_any([KEY, ("test", 1)], 30.0, Event(), cancel=cancel)):
        cancel = Event()
        g = gevent.spawn(waiting, cancel)
        gevent.sleep(0.01)
        assert len(w) >= 1  # parked
        started = time.monotonic()
        cancel.set()  # the caller's request is gone (a gRPC call reset, its connection ended)
        assert g.get(timeout=15) is True
        assert time.monotonic() - started < 15  # not the 30 s timeout
        assert len(w) == 0
        assert w.wait(KEY, 30.0, cancel=cancel) is True  # cancelled before it began: never waits


def test_a_users_long_polls_count_against_its_quota_and_leave_frees_them():
    from metaq.errors import QuotaExceeded

    def quota(user, held):
        if held + 1 > 2:
            raise QuotaExceeded("parked_gets", user, 2, "quota parked_gets of user %s is 2" % user)

    w = PartitionWaiters(max_parked=3, quota=quota)
    assert w.admit("alice") and w.admit("alice")  # at her quota
    with pytest.raises(QuotaExceeded, match="parked_gets"):
        w.admit("alice")  # one past
    assert (w.parked, w.by_user) == (2, {"alice": 2})  # the refused one not counted
    assert w.admit("bob")  # another user's own share
    assert not w.admit("carol")  # the broker's bound first
    w.leave("alice")
    w.leave("bob")
    assert (w.parked, w.by_user) == (1, {"alice": 1})
    assert w.admit()  # a caller naming no user counts on the broker only
    assert w.by_user == {"alice": 1}
