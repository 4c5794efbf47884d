"""The broker's own requests waiting on a remoting connection (pushed replies, check-backs) are bounded in bytes,
per connection and in all (an attack review: 20 requester connections that never read held 2.6 GB of pushed
4 MiB replies, each connection only counted). Over a socket pair: no network."""

import socket
import types

from metaq.server.remoting import limits as remoting_limits
from metaq.protocol.rocketmq.remoting import RequestCode
from metaq.serving.connections import ConnectionLimits
from metaq.server.remoting.server import RemotingConnection

MiB = 1 << 20


def connection(server):
    ours, theirs = socket.socketpair()
    return RemotingConnection(server, ours, ("127.0.0.1", 1), 1), theirs


def test_pushes_wait_within_the_connection_and_broker_byte_budgets():
    server = types.SimpleNamespace(core=types.SimpleNamespace(rules=ConnectionLimits(600, 30)),
                                   config=types.SimpleNamespace(max_frame_bytes=16 * MiB), notify_bytes=0)
    conn, peer = connection(server)
    push = RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT
    body = b"r" * (4 * MiB)
    per_conn = remoting_limits.MAX_PENDING_NOTIFY_BYTES // len(body)
    # queued (their greenlets have not run: nothing sent yet), up to the connection's bytes; one past is refused
    assert all(conn.send_request(push, {}, body, oneway=False) for _ in range(per_conn))
    assert not conn.send_request(push, {}, body, oneway=False)
    assert conn.send_request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "g"})  # no body: fits
    assert server.notify_bytes == per_conn * len(body)
    # the broker's total: every connection stops queueing at it, one that holds none too (thousands of
    # connections holding one each would pass any per-connection bound)
    server.notify_bytes = remoting_limits.MAX_PENDING_NOTIFY_BYTES_TOTAL - len(body) // 2
    other, other_peer = connection(server)
    assert not other.send_request(push, {}, body, oneway=False)
    assert other.send_request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "g"})  # no body: fits
    server.notify_bytes = 0  # nothing waiting anywhere: one larger than the total still goes
    third, third_peer = connection(server)
    assert third.send_request(push, {}, b"x" * (remoting_limits.MAX_PENDING_NOTIFY_BYTES_TOTAL + 1), oneway=False)
    for c, p in ((conn, peer), (other, other_peer), (third, third_peer)):
        c.close()
        p.close()


def test_a_groups_changes_within_the_window_are_told_once():
    # an attack review: each of 20,000 joins told every member of the group (quadratic: 18 s of the loop)
    import gevent

    from metaq.server.remoting import server as remoting_server

    told = []

    class Member:
        closed = False

        def __init__(self, name):
            self.name = name

        def send_request(self, code, fields, body=b"", oneway=True):
            told.append((self.name, fields["consumerGroup"]))
            return True

    members = [Member("m%d" % i) for i in range(50)]
    fake = types.SimpleNamespace(_changed=set(), _notifier=None,
                                 clients=types.SimpleNamespace(connections=lambda group: members))
    fake._notify_changed = lambda: remoting_server.RemotingServer._notify_changed(fake)
    for _ in range(1000):
        remoting_server.RemotingServer._group_changed(fake, "g")
    remoting_server.RemotingServer._group_changed(fake, "h")
    assert told == []  # not yet: the window
    gevent.sleep(remoting_server.NOTIFY_COALESCE_S * 3)
    assert len(told) == 2 * len(members)  # each member once per group, not once per change
    assert sorted({g for _m, g in told}) == ["g", "h"] and fake._notifier is None


def test_requests_in_progress_are_bounded_per_connection_and_over_every_connection():
    # a send's body stays held until its answer is sent: one connection's, and every connection's together
    from metaq.serving.connections import ReplyBudget

    per_conn = ReplyBudget(remoting_limits.MAX_REMOTING_INFLIGHT_BYTES)
    total = ReplyBudget(remoting_limits.MAX_REMOTING_INFLIGHT_BYTES_TOTAL)
    body = 4 * MiB
    never = lambda: False  # noqa: E731
    assert all(per_conn.reserve(body, never) for _ in range(remoting_limits.MAX_REMOTING_INFLIGHT_BYTES // body))
    assert per_conn.would_wait(body)  # one past: the connection's reader waits
    many = remoting_limits.MAX_REMOTING_INFLIGHT_BYTES_TOTAL // body
    assert all(total.reserve(body, never) for _ in range(many))
    assert total.would_wait(body)  # thousands of connections holding a little each: the reader waits too
    total.release(body)
    assert not total.would_wait(body)
