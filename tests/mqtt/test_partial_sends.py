"""A PUBLISH a fan-out reader began and the socket took only part of (``Connection.try_send``) is finished before
anything else is written to the connection, and no other writer waits on a lock for it: a delivery blocked on its
in-flight window while a fan-out reader wrote half a packet must still be able to send once the client reads."""

import socket
from types import SimpleNamespace

import gevent
import gevent.socket

from metaq.mqtt import limits as mqtt_limits
from metaq.mqtt.acks import PubAckRun
from metaq.mqtt.connection import Connection
from metaq.mqtt.fanout import send_each
from metaq.serving.connections import ConnectionLimits


def _connection():
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    port = SimpleNamespace(settings=SimpleNamespace(max_packet_bytes=mqtt_limits.MQTT_MAX_PACKET_BYTES,
                                                   max_inflight=mqtt_limits.MQTT_MAX_INFLIGHT), put_path=None,
                           burst_durable=None, core=SimpleNamespace(rules=ConnectionLimits(60, 60)))
    conn = Connection(gevent.socket.socket(fileno=ours.detach()), ("127.0.0.1", 1), 1, port)
    return conn, gevent.socket.socket(fileno=theirs.detach())


def _read_all(peer, nbytes):
    got = bytearray()
    while len(got) < nbytes:
        got += peer.recv(65536)
    return bytes(got)


def test_a_packet_begun_by_try_send_is_finished_before_the_next_and_no_writer_waits_for_a_lock():
    conn, peer = _connection()
    first = b"A" * 200_000
    sent = conn.try_send(first)
    assert 0 < sent < len(first)  # the socket took part of it
    assert conn.unsent
    assert conn.try_send(b"B" * 10) == 0  # the rest goes first: nothing of a later packet is written
    second = b"C" * 1000
    writer = gevent.spawn(conn.send_bytes, second)  # e.g. the delivery once a PUBACK made room in flight
    gevent.sleep(0.05)
    assert not writer.ready()  # it waits for the socket, not for a lock nobody would release
    reader = gevent.spawn(_read_all, peer, len(first) + len(second))
    assert writer.get(timeout=10) is True
    assert reader.get(timeout=10) == first + second  # whole packets, in order
    assert not conn.unsent
    assert conn.flush_unsent() is True
    conn.close()
    peer.close()


def test_flush_unsent_writes_the_rest_of_a_begun_packet():
    conn, peer = _connection()
    first = b"D" * 150_000
    sent = conn.try_send(first)
    assert 0 < sent < len(first)
    flusher = gevent.spawn(conn.flush_unsent)
    reader = gevent.spawn(_read_all, peer, len(first))
    assert flusher.get(timeout=10) is True
    assert reader.get(timeout=10) == first
    assert not conn.unsent
    conn.close()
    peer.close()


def test_a_connection_is_written_by_descriptor_only_while_no_writer_is_inside_a_packet():
    """``fan_fd``: the fan-out reader's ``send_each`` writes by descriptor only a connection nobody is writing (the
    write lock free) with nothing left of a packet; what such a write leaves of its last packet (``keep_unsent``)
    goes before anything written after it."""
    conn, peer = _connection()
    assert conn.fan_fd() == conn.sock.fileno()
    first = b"E" * 200_000
    sent = conn.try_send(first)
    assert 0 < sent < len(first) and conn.fan_fd() is None  # a part is left
    reader = gevent.spawn(_read_all, peer, len(first))
    assert conn.flush_unsent() is True
    assert reader.get(timeout=10) == first
    assert conn.fan_fd() == conn.sock.fileno()
    big = b"F" * 300_000
    writer = gevent.spawn(conn.send_bytes, big)  # a writer inside a packet: it waits for the socket, lock held
    gevent.sleep(0.05)
    assert not writer.ready() and conn.fan_fd() is None
    assert conn.try_send(b"G" * 10) == 0  # nor does try_send write inside its packet
    reader = gevent.spawn(_read_all, peer, len(big))
    assert writer.get(timeout=10) is True
    assert reader.get(timeout=10) == big
    fd = conn.fan_fd()
    packet = b"H" * 150_000
    short = dict(send_each([packet], [fd]))  # what the fan-out reader does with it
    took = short.get(0, len(packet))
    assert 0 < took < len(packet)
    conn.keep_unsent(packet[took:])
    assert conn.fan_fd() is None
    after = b"I" * 100
    writer = gevent.spawn(conn.send_bytes, after)
    reader = gevent.spawn(_read_all, peer, len(packet) + len(after))
    assert writer.get(timeout=10) is True
    assert reader.get(timeout=10) == packet + after  # the packet whole, then the next
    conn.close()
    assert conn.fan_fd() is None
    peer.close()


def test_a_bursts_pubacks_written_from_the_readers_turn_stay_whole_and_in_order():
    """A burst acknowledged at once has its PUBACKs written from the reader's turn when nothing is queued before
    them (``Acknowledgements.queue`` without a writer greenlet); a run the socket takes only part of is finished by
    the writer before anything else, later acknowledgements and answers queue behind it, and a run queued while a
    packet is half written waits for it: the client reads every PUBACK whole, in order, and each is counted once."""
    conn, peer = _connection()
    big = PubAckRun(list(range(1, 5001)))  # 20,000 bytes: more than the socket takes at once
    small = PubAckRun([7, 8, 9])
    acks = conn.acks
    acks.unacked = 5003
    acks.queue(big)
    assert conn.unsent and acks.writing  # part written now, the rest the writer's
    acks.queue(small)  # behind the writer, not written before the rest of the first run
    acks.send_in_order(b"\xd0\x00")  # an answer queued behind the acknowledgements
    expected = big.encoded() + small.encoded() + b"\xd0\x00"
    reader = gevent.spawn(_read_all, peer, len(expected))
    assert reader.get(timeout=10) == expected
    gevent.sleep(0.05)
    assert acks.unacked == 0 and acks.pending == 0 and not acks.writing
    assert not conn.unsent
    acks.queue(PubAckRun([11]))  # nothing queued, room in the socket: written at once, no writer
    assert not acks.writing and peer.recv(16) == PubAckRun([11]).encoded()
    conn.close()
    peer.close()
