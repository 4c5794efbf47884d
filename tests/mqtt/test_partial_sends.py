"""A PUBLISH a fan-out reader began and the socket took only part of (``Connection.try_send``) is finished before
anything else is written to the connection, and no other writer waits on a lock for it: a delivery blocked on its
in-flight window while a fan-out reader wrote half a packet must still be able to send once the client reads."""

import socket
from types import SimpleNamespace

import gevent
import gevent.socket

from metaq import limits
from metaq.mqtt.connection import Connection
from metaq.server.connections import ConnectionLimits


def _connection():
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    port = SimpleNamespace(settings=SimpleNamespace(max_packet_bytes=limits.MQTT_MAX_PACKET_BYTES),
                           core=SimpleNamespace(rules=ConnectionLimits(60, 60)))
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
