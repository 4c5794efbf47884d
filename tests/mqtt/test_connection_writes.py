"""What an MQTT connection's writer sends arrives whole and in order, whatever the socket takes at once
(``Connection.send_bytes``: one non-blocking send on a plain socket, the rest waiting in gevent's ``sendall``), and a
write to a peer that went away closes the connection. The real port over a real store, a connection over a socket
pair; no network."""

import socket

import gevent
import pytest
from gevent import socket as gsocket

from metaq.mqtt.connection import Connection
from tests.harness.mqttport import inprocess_port
from tests.server.test_inprocess import Parts, config


@pytest.fixture
def port(tmp_path):
    p = Parts(config(tmp_path / "data"))
    yield inprocess_port(p)
    p.close()


def paired_connection(port):
    """A connection of ``port`` and the client's end of its socket pair, both gevent's (the client reads in a
    greenlet beside the writer's)."""
    ours, theirs = gsocket.socketpair()
    conn = Connection(ours, ("127.0.0.1", 1), 1, port)
    conn.session = port.guard.acting_for(None, "127.0.0.1")
    return conn, theirs


def _read_all(sock, size, timeout=20):
    got = bytearray()
    with gevent.Timeout(timeout):
        while len(got) < size:
            data = sock.recv(1 << 20)
            assert data, "the connection ended after %d of %d bytes" % (len(got), size)
            got += data
    return bytes(got)


def test_a_small_packet_goes_at_once(port):
    conn, theirs = paired_connection(port)
    assert conn.send_bytes(b"\x20\x02\x00\x00")  # a CONNACK
    theirs.settimeout(5)
    assert theirs.recv(16) == b"\x20\x02\x00\x00"


def test_packets_past_the_sockets_buffer_arrive_whole_and_in_order_to_a_late_reader(port):
    conn, theirs = paired_connection(port)
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    packets = [b"a" * 10, bytes(range(256)) * 8192, b"b" * 100, b"c" * 300000]
    writer = gevent.spawn(lambda: [conn.send_bytes(p) for p in packets])
    gevent.sleep(0.3)  # the reader comes late: the first big packet's rest waits for it
    assert not writer.ready()
    assert _read_all(theirs, sum(map(len, packets))) == b"".join(packets)
    assert writer.get(timeout=10) == [True] * len(packets)


def test_a_write_to_a_peer_gone_closes_the_connection(port):
    conn, theirs = paired_connection(port)
    theirs.close()
    gevent.sleep(0.05)
    assert conn.send_bytes(b"\xd0\x00") is False  # a PINGRESP
    assert conn.closed
