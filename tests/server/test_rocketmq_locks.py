"""The lock table of orderly consumers (metaq.server.remoting.locks): RocketMQ's RebalanceLockManager rules, plus
release on unregister and on connection close, and its bound. Pure: no network, time passed in."""

import ast
import pathlib

import pytest

from metaq.server.remoting import limits as remoting_limits
from metaq.server.remoting import locks as locks_module
from metaq.server.remoting.locks import LockTable

Q0, Q1, Q2 = ("t", 0), ("t", 1), ("t", 2)


def test_a_queue_is_held_by_one_client_of_a_group_at_a_time():
    table = LockTable(60.0)
    a, b = object(), object()
    assert table.lock("G", "c1", a, [Q0, Q1], 0.0) == [Q0, Q1]
    assert table.lock("G", "c2", b, [Q0, Q1, Q2], 1.0) == [Q2]  # Q0, Q1 are c1's
    assert table.holder("G", "t", 0, 1.0) == "c1" and table.holder("G", "t", 2, 1.0) == "c2"
    assert table.lock("OTHER", "c2", b, [Q0], 1.0) == [Q0]  # groups are independent
    assert table.held("G", "c1", 1.0) == [Q0, Q1] and table.held("G", "c2", 1.0) == [Q2]
    assert len(table) == 4


def test_asking_again_renews_and_an_unrenewed_lock_expires():
    table = LockTable(60.0)
    a, b = object(), object()
    table.lock("G", "c1", a, [Q0, Q1], 0.0)
    assert table.lock("G", "c1", a, [Q0], 50.0) == [Q0]  # renewed at 50; Q1 not
    assert table.lock("G", "c2", b, [Q0, Q1], 60.0) == []  # exactly 60 s: still live, as in RocketMQ
    assert table.lock("G", "c2", b, [Q0, Q1], 60.5) == [Q1]  # Q1 expired: c2 takes it; Q0 renewed at 50
    assert table.holder("G", "t", 1, 60.5) == "c2"
    assert table.holder("G", "t", 0, 110.5) is None  # expired, though still in the table
    assert table.expire(110.5) == 1 and len(table) == 1
    assert table.lock("G", "c2", b, [Q0], 110.5) == [Q0]


def test_an_expired_lock_may_be_taken_back_by_its_own_client():
    table = LockTable(5.0)
    a = object()
    table.lock("G", "c1", a, [Q0], 0.0)
    assert table.held("G", "c1", 6.0) == []
    assert table.lock("G", "c1", a, [Q0], 6.0) == [Q0] and table.held("G", "c1", 6.0) == [Q0]


def test_only_the_holder_unlocks_and_only_through_its_connection():
    table = LockTable(60.0)
    a, b, other = object(), object(), object()
    table.lock("G", "c1", a, [Q0, Q1], 0.0)
    assert table.unlock("G", "c2", b, [Q0]) == []  # not its lock
    assert table.unlock("G", "c1", other, [Q0]) == []  # its id, but another connection
    assert table.unlock("OTHER", "c1", a, [Q0]) == []
    assert table.unlock("G", "c1", a, [Q0, Q0, Q2]) == [Q0]
    assert table.lock("G", "c2", b, [Q0], 1.0) == [Q0]


def test_unregister_releases_the_clients_locks_in_that_group_only():
    table = LockTable(60.0)
    a, b = object(), object()
    table.lock("G", "c1", a, [Q0, Q1], 0.0)
    table.lock("H", "c1", a, [Q0], 0.0)
    table.lock("G", "c2", b, [Q2], 0.0)
    assert table.release_client("G", "c1", b) == 0  # through another connection: nothing
    assert table.release_client("G", "c1", a) == 2
    assert table.held("H", "c1", 1.0) == [Q0] and table.held("G", "c2", 1.0) == [Q2]
    assert table.lock("G", "c2", b, [Q0, Q1], 1.0) == [Q0, Q1]


def test_a_closed_connection_releases_everything_held_through_it():
    table = LockTable(60.0)
    a, b = object(), object()
    table.lock("G", "c1", a, [Q0, Q1], 0.0)
    table.lock("H", "c9", a, [Q2], 0.0)
    table.lock("G", "c2", b, [Q2], 0.0)
    assert table.connection_closed(a) == 3
    assert table.connection_closed(a) == 0
    assert len(table) == 1 and table.lock("G", "c2", b, [Q0, Q1], 1.0) == [Q0, Q1]


def test_a_lock_renewed_through_a_new_connection_moves_to_it():
    """A client that reconnected renews through its new connection; the old one closing then frees nothing."""
    table = LockTable(60.0)
    old, new = object(), object()
    table.lock("G", "c1", old, [Q0], 0.0)
    assert table.lock("G", "c1", new, [Q0], 1.0) == [Q0]
    assert table.connection_closed(old) == 0 and table.holder("G", "t", 0, 2.0) == "c1"
    assert table.connection_closed(new) == 1


def test_a_lock_taken_over_after_expiry_leaves_the_old_connections_index():
    table = LockTable(5.0)
    a, b = object(), object()
    table.lock("G", "c1", a, [Q0], 0.0)
    assert table.lock("G", "c2", b, [Q0], 10.0) == [Q0]
    assert table.connection_closed(a) == 0  # a's index no longer names Q0
    assert table.holder("G", "t", 0, 10.0) == "c2"


def test_duplicates_in_a_request_count_once():
    table = LockTable(60.0)
    a = object()
    assert table.lock("G", "c1", a, [Q0, Q0, Q1, Q0], 0.0) == [Q0, Q1]
    assert len(table) == 2


def test_the_table_holds_at_most_max_locks_and_purges_expired_ones_first():
    table = LockTable(10.0, max_locks=3)
    a, b = object(), object()
    assert table.lock("G", "c1", a, [Q0, Q1, Q2], 0.0) == [Q0, Q1, Q2]  # at the limit
    assert table.lock("G", "c1", a, [("t", 3)], 1.0) == [] and table.full_refusals == 1  # one past it
    assert table.lock("G", "c1", a, [Q0, Q1, Q2], 2.0) == [Q0, Q1, Q2]  # renewing needs no room
    assert table.lock("H", "c2", b, [Q0], 13.0) == [Q0]  # all three expired at 12: purged, room again
    assert len(table) == 1 and table.full_refusals == 1


def test_the_default_bound_is_the_named_limit():
    assert LockTable(60.0).max_locks == remoting_limits.MAX_REMOTING_LOCKS
    with pytest.raises(ValueError):
        LockTable(0)


def test_the_table_is_pure():
    """No socket, gevent, thread, clock or logging: time comes in as an argument."""
    tree = ast.parse(pathlib.Path(locks_module.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"typing", "metaq"}, imported
