"""Issue 15 point 7: a peer on the replication port that lies or talks nonsense is not a replica.

(Who may connect to that port at all is the authentication issue.)
"""

import os
import socket
import time

from metaq.client.local import free_port
from metaq.protocol import events as ev
from metaq.protocol import replication as rp
from tests.harness.broker import wait_for
from tests.harness.replication import master_config, stats


def fake_slave(rport, slave_id=9):
    """A peer on the replication port of a master with no replication secret: reads its CHALLENGE, answers
    with a nonce and no proof and HELLO like a fresh slave, reads the master's PROOF and EPOCHS."""
    sock = socket.create_connection(("127.0.0.1", rport), timeout=5)
    parser = rp.ReplicationParser()
    expected = [rp.Challenge, rp.Proof, rp.Epochs]
    while expected:
        event = parser.next_event()
        if event is rp.NEED_DATA:
            parser.receive_data(sock.recv(65536))
            continue
        assert isinstance(event, expected.pop(0)), event
        if isinstance(event, rp.Challenge):
            assert not event.secret
            sock.sendall(rp.serialize(rp.Proof("5a" * 16, ""))  # small_config: broker 7, 1 MiB segments
                         + rp.serialize(rp.Hello(slave_id, 7, 1 << 20, 0)))
    return sock, parser


def closed_by_master(sock, timeout=10):
    """True once the master has closed the link (whatever it sent before); False if it is still open after
    ``timeout`` seconds (a live link sends a heartbeat every second)."""
    deadline = time.monotonic() + timeout
    sock.settimeout(1.5)
    while time.monotonic() < deadline:
        try:
            if not sock.recv(65536):
                return True
        except ConnectionResetError:
            return True
        except socket.timeout:
            continue
    return False


def test_an_ack_past_what_the_link_sent_closes_it_and_acknowledges_nothing(broker_factory, tmp_path):
    """A peer that claims to hold 2^62 bytes is not a replica: sync puts are not acknowledged on its word."""
    rport = free_port()
    master = broker_factory(master_config(tmp_path / "m", rport, mode="sync", sync_timeout_ms=1000),
                            workdir=tmp_path / "m")
    sock, _parser = fake_slave(rport)
    wait_for(lambda: stats(master)["replication_slaves"] == "1", 10, "fake slave connected")
    sock.sendall(rp.serialize(rp.Ack(9, 1 << 62, 1 << 62)))
    assert closed_by_master(sock)
    wait_for(lambda: stats(master)["replication_slaves"] == "0", 10, "link closed")
    with master.client() as c:
        r = c.put("t-a", b"nobody holds this")
        assert r.code == 503 and b"SLAVE_NOT_AVAILABLE" in r.body, r
    text = master.log_text()
    assert "acked written 4611686018427387904, durable 4611686018427387904, but this link has sent up to 0" in text
    assert "Traceback" not in text


def test_garbage_after_hello_closes_the_link_without_a_traceback(broker_factory, tmp_path):
    rport = free_port()
    master = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    with master.client() as c:
        c.put_ok("t-a", b"before the garbage", 0)
    sock, _parser = fake_slave(rport)
    sock.sendall(os.urandom(4096))
    assert closed_by_master(sock)
    wait_for(lambda: stats(master)["replication_slaves"] == "0", 10, "link closed")
    with master.client() as c:
        assert c.call(ev.Version(1)).code == 200
        assert c.get_records("t-a", 0, 0)[0].data == b"before the garbage"  # acknowledged earlier, intact
    assert "Traceback" not in master.log_text()
