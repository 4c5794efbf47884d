"""A burst's PUBACKs written from the reader's turn (``plainturn.pubacks_now``, which ``Acknowledgements.pubacks`` and
the reader's one-step turn both use; compiled where built), on real sockets: written at once by the socket's
descriptor when nothing is queued before them; a full socket, acknowledgements queued before them or a TLS connection
leaves them to the writer, in order; a part written is finished before anything else; a failed send closes the
connection. Seeded cases hold every outcome to what it must leave behind."""

import random
import socket
import ssl
from types import SimpleNamespace

import gevent
import gevent.socket
import pytest
from gevent import ssl as gevent_ssl
from gevent.event import Event

from metaq.mqtt import limits as mqtt_limits
from metaq.mqtt.connection import Connection
from metaq.mqtt.plainturn import pubacks_now
from metaq.mqtt.wire import encode_pubacks_py
from metaq.serving.connections import ConnectionLimits
from tests.harness.pki import Pki

PINGRESP = b"\xd0\x00"


def _port():
    return SimpleNamespace(settings=SimpleNamespace(max_packet_bytes=mqtt_limits.MQTT_MAX_PACKET_BYTES,
                                                   max_inflight=mqtt_limits.MQTT_MAX_INFLIGHT), put_path=None,
                           burst_durable=None, core=SimpleNamespace(rules=ConnectionLimits(60, 60)))


def _connection():
    """A connection on one end of a socketpair with small buffers, and the client's end (plain, non-blocking: read
    without yielding)."""
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    theirs.setblocking(False)
    return Connection(gevent.socket.socket(fileno=ours.detach()), ("127.0.0.1", 1), 1, _port()), theirs


def _fill(conn):
    """What the socket takes until its buffer is full (written by the test, as another writer would)."""
    filler = bytearray()
    try:
        while True:
            filler += b"f" * conn.raw_sock.send(b"f" * 4096)
    except BlockingIOError:
        return bytes(filler)


def _drain(peer):
    """What the client's end holds now."""
    got = bytearray()
    try:
        while True:
            chunk = peer.recv(65536)
            if not chunk:
                return bytes(got)
            got += chunk
    except BlockingIOError:
        return bytes(got)


def _read(peer, nbytes, timeout=10):
    """``nbytes`` read by the client, yielding while none are there (the writer greenlet runs meanwhile)."""
    got = bytearray()
    with gevent.Timeout(timeout):
        while len(got) < nbytes:
            got += _drain(peer)
            gevent.sleep(0.001)
    return bytes(got)


def _pubacks(first, count):
    return encode_pubacks_py(list(range(first, first + count)))


def test_pubacks_that_may_go_are_written_at_once_by_descriptor():
    conn, peer = _connection()
    acks = conn.acks
    assert conn.direct_fd >= 0
    acks.unacked = 5
    acks.sent = Event()  # the reader once waited for room
    data = _pubacks(1, 3)
    assert pubacks_now(acks, conn, data) is True
    assert _drain(peer) == data  # before anything yielded
    assert (acks.unacked, acks.pending, acks.writing, conn.unsent) == (2, 0, False, False)
    assert acks.sent.is_set()
    acks.pubacks(_pubacks(4, 2))  # Acknowledgements.pubacks: the same, no writer
    assert _drain(peer) == _pubacks(4, 2) and acks.unacked == 0 and not acks.writing
    conn.close()


def test_a_full_socket_leaves_them_to_the_writer_in_order():
    conn, peer = _connection()
    acks = conn.acks
    filler = _fill(conn)
    acks.unacked = 5
    first, second = _pubacks(1, 3), _pubacks(4, 2)
    assert pubacks_now(acks, conn, first) is False  # nothing written: the caller queues them
    assert (acks.unacked, conn.unsent, conn.closed) == (5, False, False)
    acks.pubacks(first)
    assert acks.writing and acks.pending == 1
    acks.pubacks(second)  # behind them
    assert _read(peer, len(filler) + 20) == filler + first + second
    gevent.sleep(0.01)
    assert (acks.unacked, acks.pending, acks.writing) == (0, 0, False)
    conn.close()


def test_a_part_written_is_finished_by_the_writer_before_anything_else():
    conn, peer = _connection()
    acks = conn.acks
    big = _pubacks(1, 5000)  # 20,000 bytes: more than the socket takes at once
    acks.unacked = 5003
    assert pubacks_now(acks, conn, big) is True
    assert conn.unsent and acks.writing and conn.direct_fd == -1  # the rest is the writer's
    assert acks.unacked == 3  # counted as they went
    acks.pubacks(_pubacks(5001, 3))  # queued behind the rest, not written into it
    acks.send_in_order(PINGRESP)  # an answer behind the acknowledgements
    expected = big + _pubacks(5001, 3) + PINGRESP
    assert _read(peer, len(expected)) == expected
    gevent.sleep(0.01)
    assert (acks.unacked, acks.pending, acks.writing, conn.unsent) == (0, 0, False, False)
    assert conn.direct_fd >= 0  # written by descriptor again
    conn.close()


def test_a_failed_send_closes_the_connection_and_raises_nothing():
    conn, peer = _connection()
    acks = conn.acks
    acks.unacked = 3
    peer.close()  # the client is gone: the send fails (EPIPE)
    assert conn.direct_fd >= 0
    assert pubacks_now(acks, conn, _pubacks(1, 3)) is False
    assert conn.closed and conn.direct_fd == -1
    acks.pubacks(_pubacks(1, 3))  # through try_send: closed, queued, the writer writes nothing
    gevent.sleep(0.01)
    assert (acks.pending, acks.writing) == (0, False)


def test_no_pubacks_write_nothing_even_to_a_peer_gone():
    """Nothing to write is not a send: a connection whose client left is not closed by it (it ends by its read)."""
    conn, peer = _connection()
    peer.close()
    assert pubacks_now(conn.acks, conn, b"") is False
    assert not conn.closed and conn.direct_fd >= 0


def test_pubacks_behind_queued_acknowledgements_wait_for_them():
    conn, peer = _connection()
    acks = conn.acks
    acks.unacked = 3
    acks.send_in_order(PINGRESP)  # nothing queued: written now
    assert _drain(peer) == PINGRESP
    acks.queue(PINGRESP)  # queued: the writer has not run yet
    data = _pubacks(1, 3)
    assert pubacks_now(acks, conn, data) is False  # not before the answer queued before them
    assert _drain(peer) == b"" and acks.unacked == 3
    acks.pubacks(data)
    assert _read(peer, 2 + len(data)) == PINGRESP + data
    gevent.sleep(0.01)
    assert (acks.unacked, acks.pending, acks.writing) == (0, 0, False)
    conn.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


def test_a_tls_connection_has_them_written_by_the_writer_through_tls(pki):
    """An SSL socket encrypts what it writes: never written by descriptor, the PUBACKs go through ``try_send``,
    which leaves them to the writer."""
    ours, theirs = socket.socketpair()
    server = gevent_ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pki.server_cert, pki.server_key)
    client = gevent_ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(pki.ca)
    wrapped = server.wrap_socket(gevent.socket.socket(fileno=ours.detach()), server_side=True,
                                 do_handshake_on_connect=False)
    peer = client.wrap_socket(gevent.socket.socket(fileno=theirs.detach()), server_hostname="127.0.0.1",
                              do_handshake_on_connect=False)
    shake = gevent.spawn(peer.do_handshake)
    wrapped.do_handshake()
    shake.get(timeout=10)
    conn = Connection(wrapped, ("127.0.0.1", 1), 1, _port())
    acks = conn.acks
    assert conn.tls and conn.direct_fd == -1
    acks.unacked = 3
    data = _pubacks(1, 3)
    assert pubacks_now(acks, conn, data) is False and acks.unacked == 3
    acks.pubacks(data)
    assert acks.writing
    got = bytearray()
    with gevent.Timeout(10):
        while len(got) < len(data):
            got += peer.recv(1024)
    assert bytes(got) == data
    gevent.sleep(0.01)
    assert (acks.unacked, acks.pending, acks.writing, conn.closed) == (0, 0, False, False)
    conn.close()
    peer.close()


def _case(seed):
    """One seeded case on fresh sockets: its setup and what ``pubacks_now`` returns and leaves before anything
    yields."""
    rng = random.Random(seed)
    conn, peer = _connection()
    acks = conn.acks
    filled = kept = b""
    if rng.random() < 0.4:  # the socket partly or wholly full
        filled = _fill(conn) if rng.random() < 0.5 else b"f" * conn.raw_sock.send(b"f" * rng.randrange(1, 9000))
    gone = rng.random() < 0.1
    if gone:
        peer.close()
    queued = rng.random() < 0.15
    if queued:
        acks.queue(PINGRESP)  # an answer queued before them
    if rng.random() < 0.1:
        kept = b"u" * rng.randrange(1, 50)
        conn.keep_unsent(kept)  # a part of a packet left by another writer
    if rng.random() < 0.3:
        acks.sent = Event()
    count = rng.choice([1, 2, rng.randrange(1, 200), rng.randrange(1, 8000)])
    unacked = acks.unacked = count + rng.randrange(3)
    data = _pubacks(1, count)
    went = pubacks_now(acks, conn, data)
    got = None if gone else _drain(peer)[len(filled):]
    case = SimpleNamespace(went=went, data=data, count=count, unacked=unacked, queued=queued, kept=kept, gone=gone,
                           got=got, left=acks.unacked, pending=acks.pending, closed=conn.closed, unsent=conn.unsent,
                           sent=acks.sent is not None and acks.sent.is_set(), made_sent=acks.sent is not None)
    conn.close()
    peer.close()
    gevent.sleep(0)  # a writer started ends: the connection is closed
    return case


def test_each_outcome_leaves_the_pubacks_counted_and_in_place():
    """Seeded cases (a socket part full or full, the client gone, an answer queued before, a part of a packet left
    unsent, the reader once waiting): written, all or a part (the rest kept, finished by the writer), the PUBACKs are
    counted as acknowledged and the waiting reader told; not written, nothing of them went, none is counted and the
    caller queues them. Never before an answer queued before them."""
    rng = random.Random(6011)
    seen = set()
    for _ in range(300):
        c = _case(rng.random())
        if c.went:
            assert c.left == c.unacked - c.count and c.sent == c.made_sent and not c.queued
            if c.got is not None:  # what the client got: a kept part first, then the PUBACKs' head
                assert c.got.startswith(c.kept)
                assert c.data.startswith(c.got[len(c.kept):])
                if not c.unsent:
                    assert c.got == c.kept + c.data
            if c.unsent:
                assert c.pending >= 1  # the writer finishes what the connection keeps
            seen.add("part" if c.unsent else "written")
        else:
            assert c.left == c.unacked and not c.sent
            assert c.got is None or c.data[:4] not in c.got
            seen.add("failed" if c.closed else "behind" if c.queued else "full")
    assert seen == {"written", "part", "failed", "behind", "full"}
