"""Issue 16: replication is authenticated both ways with the shared replication secret (real brokers; strangers,
impostor masters and replayed sessions are raw sockets speaking our frames)."""

import os
import socket
import threading
import time

import pytest

from metaq.auth import proofs
from metaq.client.local import free_port, small_config
from metaq.protocol import events as ev
from metaq.protocol import replication as rp
from tests.harness.broker import wait_for
from tests.harness.replication import commitlog, master_config, stats

pytestmark = pytest.mark.integration

SECRET = "replication-secret-0123456789abcdef"
OTHER = "not-the-replication-secret-0123456"
BODY = b"secret payload 7f3a9c"  # must never reach a peer that did not prove the secret


def master_cfg(tmp_path, rport, secret, **replication):
    cfg = master_config(tmp_path / "m", rport, **replication)
    if secret:
        cfg["security"] = {"replication_secret": secret}
    return cfg


def start_master(broker_factory, tmp_path, secret, **replication):
    rport = free_port()
    return broker_factory(master_cfg(tmp_path, rport, secret, **replication), workdir=tmp_path / "m"), rport


def slave_cfg(wd, secret):
    cfg = small_config(os.path.join(str(wd), "data"))
    if secret:
        cfg["security"] = {"replication_secret": secret}
    return cfg


def slave_args(rport, slave_id=1):
    return ["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", str(slave_id)]


def start_slave(broker_factory, wd, rport, secret, slave_id=1):
    return broker_factory(slave_cfg(wd, secret), workdir=wd, extra_args=slave_args(rport, slave_id))


def bodies(client, topic="t-a", partition=0):
    """The bodies of a partition's messages from offset 0 ([] when it has none: 404)."""
    r = client.get_records(topic, partition, 0)
    if isinstance(r, ev.Result):
        assert r.code == 404, r
        return []
    return [rec.data for rec in r]


def in_log(broker, text, timeout=15):
    wait_for(lambda: text in broker.log_text(), timeout, lambda: "%r in the log of %s:\n%s" % (
        text, broker.workdir, broker.log_text()[-3000:]))


def events_of(data):
    """Every frame in ``data`` (a whole stream, up to its close)."""
    p = rp.ReplicationParser()
    p.receive_data(data)
    p.receive_data(b"")
    out = []
    while True:
        event = p.next_event()
        if event is rp.CLOSED:
            return out
        out.append(event)


class Peer:
    """One raw connection that speaks our frames, recording every byte it receives."""

    def __init__(self, sock):
        self.sock = sock
        self.sock.settimeout(15)
        self.parser = rp.ReplicationParser()
        self.received = bytearray()

    @classmethod
    def connect(cls, port):
        return cls(socket.create_connection(("127.0.0.1", port), timeout=5))

    def next(self, deadline=None):
        """The next frame, or rp.CLOSED (also when ``deadline``, a monotonic time, passes first)."""
        while True:
            event = self.parser.next_event()
            if event is not rp.NEED_DATA:
                return event
            if deadline is not None and time.monotonic() > deadline:
                return rp.CLOSED
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            self.received += data
            self.parser.receive_data(data)

    def drain(self, timeout=15):
        """Read until the other side closes (a live link never does: at most ``timeout`` s): every byte received
        on this connection."""
        deadline = time.monotonic() + timeout
        while self.next(deadline) is not rp.CLOSED:
            pass
        return bytes(self.received)

    def send(self, *events):
        self.sock.sendall(b"".join(rp.serialize(e) for e in events))

    def close(self):
        self.sock.close()


def stranger_hello(peer, proof="", slave_id=9):
    """Answer the master's CHALLENGE like a slave with no secret (``proof``: what it offers instead)."""
    challenge = peer.next()
    assert isinstance(challenge, rp.Challenge), challenge
    peer.send(rp.Proof(proofs.new_nonce(), proof), rp.Hello(slave_id, 7, 1 << 20, 0))
    return challenge


# -- the real thing -----------------------------------------------------------------------------------------------

def test_a_slave_with_the_secret_replicates(broker_factory, tmp_path):
    master, rport = start_master(broker_factory, tmp_path, SECRET)
    with master.client() as c:
        c.put_ok("t-a", BODY, 0)
    slave = start_slave(broker_factory, tmp_path / "s", rport, SECRET)
    wait_for(lambda: stats(slave)["replication_link"] == "connected", 15, "link up")
    with master.client() as c:
        c.put_ok("t-a", b"after the handshake", 0)
    with slave.client() as c:
        wait_for(lambda: len(bodies(c)) == 2, 15, "both messages on the slave")
        assert bodies(c) == [BODY, b"after the handshake"]
    assert "slaves must prove the replication secret" in master.log_text()
    assert "not following" not in slave.log_text() and "Traceback" not in master.log_text()


def test_a_slave_with_a_wrong_secret_is_refused_before_any_log_byte(broker_factory, tmp_path):
    master, rport = start_master(broker_factory, tmp_path, SECRET)
    with master.client() as c:
        c.put_ok("t-a", BODY, 0)
    slave = start_slave(broker_factory, tmp_path / "s", rport, OTHER)
    in_log(master, "refusing slave 1 from 127.0.0.1:")
    in_log(master, "the master requires a replication secret and the proof of slave 1 is wrong")
    in_log(slave, "not following master 127.0.0.1:%d: the master refused replication (401): the master requires "
                  "a replication secret" % rport)
    s = stats(slave)
    assert s["log_end_position"] == "0" and s["replication_link"] == "down"
    assert stats(master)["replication_slaves"] == "0"
    assert all(BODY not in seg for seg in commitlog(slave).values())
    with slave.client() as c:
        assert bodies(c) == []


@pytest.mark.parametrize("master_secret, slave_secret, master_says, slave_says", [
    (SECRET, None, "the master requires a replication secret (security.replication_secret (or "
                   "replication_secret_file)) and slave 1 offered no proof of it",
     "the master refused replication (401): the master requires a replication secret"),
    (None, SECRET, "gave up the handshake (401): this slave requires its master to prove the secret, and the master "
                   "holds no replication secret",
     "not following master 127.0.0.1:%d: this slave requires its master to prove the secret"),
])
def test_a_secret_on_one_side_only_is_refused_on_both(broker_factory, tmp_path, master_secret, slave_secret,
                                                      master_says, slave_says):
    master, rport = start_master(broker_factory, tmp_path, master_secret)
    with master.client() as c:
        c.put_ok("t-a", BODY, 0)
    slave = start_slave(broker_factory, tmp_path / "s", rport, slave_secret)
    in_log(master, master_says)
    in_log(slave, slave_says.replace("%d", str(rport)))
    assert stats(slave)["log_end_position"] == "0"
    assert "Traceback" not in master.log_text() + slave.log_text()


# -- strangers on the master's replication port -------------------------------------------------------------------

@pytest.mark.parametrize("proof", ["", "ab" * 32, proofs.replication_proof(OTHER.encode(), "slave", "0" * 32,
                                                                            "1" * 32, 9)])
def test_a_stranger_gets_an_error_and_nothing_of_the_log(broker_factory, tmp_path, proof):
    master, rport = start_master(broker_factory, tmp_path, SECRET)
    with master.client() as c:
        c.put_ok("t-a", BODY, 0)
    peer = Peer.connect(rport)
    challenge = stranger_hello(peer, proof)
    assert challenge.secret
    got = peer.drain()
    frames = events_of(got)
    assert [type(f) for f in frames] == [rp.Challenge, rp.ErrorFrame], frames
    assert frames[1].code == 401 and "the master requires a replication secret" in frames[1].text
    assert BODY not in got
    # no DATA (2), EPOCHS (6) nor PROOF (8) frame header anywhere in what came back
    assert all(rp.FRAME_HEADER.unpack_from(got, at)[2] in (rp.T_CHALLENGE, rp.T_ERROR)
               for at in frame_offsets(got))
    in_log(master, "refusing slave 9 from 127.0.0.1:")


def frame_offsets(data):
    at, out = 0, []
    while at < len(data):
        out.append(at)
        at += rp.FRAME_HEADER.size + rp.FRAME_HEADER.unpack_from(data, at)[4]
    return out


def test_an_old_version_peer_gets_a_clear_unsupported_version_error(broker_factory, tmp_path):
    master, rport = start_master(broker_factory, tmp_path, SECRET)
    v2_hello = bytearray(rp.serialize(rp.Hello(9, 7, 1 << 20, 0)))
    v2_hello[4] = 2  # a version-2 slave says HELLO at once (the CRC is not even looked at)
    peer = Peer.connect(rport)
    peer.sock.sendall(bytes(v2_hello))
    frames = events_of(peer.drain())
    assert [type(f) for f in frames] == [rp.Challenge, rp.ErrorFrame]
    assert "unsupported replication stream version 2 (this side speaks 4)" in frames[1].text
    in_log(master, "unsupported replication stream version 2 (this side speaks 4)")


class AckingStranger(threading.Thread):
    """A peer that says HELLO without the secret, then acknowledges every byte it is sent (a would-be replica)."""

    def __init__(self, rport):
        super().__init__(daemon=True)
        self.peer = Peer.connect(rport)
        self.frames = []

    def run(self):
        stranger_hello(self.peer)
        try:
            while True:
                event = self.peer.next()
                if event is rp.CLOSED:
                    return
                self.frames.append(event)
                if isinstance(event, rp.Data):
                    end = event.position + len(event.data)
                    self.peer.send(rp.Ack(9, end, end))
                elif isinstance(event, rp.Heartbeat):
                    self.peer.send(rp.Ack(9, event.position, event.position))
        except OSError:
            return


@pytest.mark.parametrize("secret", [None, SECRET])
def test_a_stranger_acking_cannot_acknowledge_sync_puts(broker_factory, tmp_path, secret):
    """Without a secret (the control), a stranger is a replica and its ACKs confirm sync puts; with one, the
    same stranger is refused and the put is not confirmed."""
    master, rport = start_master(broker_factory, tmp_path, secret, mode="sync", sync_timeout_ms=1500)
    stranger = AckingStranger(rport)
    stranger.start()
    if secret is None:
        wait_for(lambda: stats(master)["replication_slaves"] == "1", 10, "the stranger attached")
    else:
        in_log(master, "refusing slave 9")
    with master.client() as c:
        r = c.put("t-a", BODY, 0)
    if secret is None:
        assert r.code == 200, r
        assert any(isinstance(f, rp.Data) for f in stranger.frames)
    else:
        assert r.code == 503 and b"SLAVE_NOT_AVAILABLE" in r.body, r
        stranger.join(10)
        assert [type(f) for f in stranger.frames] == [rp.ErrorFrame], stranger.frames
    stranger.peer.close()


# -- impostor masters -----------------------------------------------------------------------------------------------

class FakeMaster:
    """A raw server standing where a slave expects its master: ``script(peer)`` runs for each connection."""

    def __init__(self, script):
        self.script = script
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sessions = []  # the Peer of each connection, with what the slave sent
        self.errors = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            peer = Peer(sock)
            self.sessions.append(peer)
            try:
                self.script(peer)
                peer.drain()
            except Exception as exc:  # noqa: BLE001 - recorded for the test's assertions
                self.errors.append(exc)
            finally:
                peer.close()

    def close(self):
        self.server.close()


def slave_with_a_log(broker_factory, wd, secret=SECRET):
    """A broker that wrote messages as a standalone master, now stopped: its commit log to keep intact."""
    b = broker_factory(slave_cfg(wd, secret), workdir=wd)
    with b.client() as c:
        for i in range(5):
            c.put_ok("t-a", b"%s %d" % (BODY, i), i % 2)
    b.stop()
    return b, commitlog(b)


def follow(b, port, slave_id=1):
    b.extra_args = slave_args(port, slave_id)
    b.start()
    return b


def hello_then(reply):
    """A fake master's script: CHALLENGE (claiming a secret), read the slave's PROOF and HELLO, then ``reply``."""
    def script(peer):
        peer.send(rp.Challenge(True, proofs.new_nonce()))
        first = peer.next()
        if not isinstance(first, rp.Proof):
            return
        second = peer.next()
        assert isinstance(second, rp.Hello), second
        peer.send(*reply)
    return script


WHOLE_CUT = rp.Epochs(0, 0, ((0, 0, 0),))  # "our logs agree up to 0": a slave that believed it would cut everything


@pytest.mark.parametrize("reply, reason", [
    ([rp.Proof("", "ab" * 32), WHOLE_CUT], "its proof is wrong"),
    ([rp.Proof("", ""), WHOLE_CUT], "and it offered no proof"),
    ([WHOLE_CUT], "it sent EPOCHS instead of its PROOF"),
])
def test_an_impostor_master_is_not_followed(broker_factory, tmp_path, reply, reason):
    slave, before = slave_with_a_log(broker_factory, tmp_path / "s")
    impostor = FakeMaster(hello_then(reply))
    follow(slave, impostor.port)
    in_log(slave, "not following master 127.0.0.1:%d: this slave requires its master to prove the secret"
           % impostor.port)
    in_log(slave, reason)
    wait_for(lambda: len(impostor.sessions) >= 2, 10, "the slave retried")  # it keeps trying, and keeps refusing
    assert commitlog(slave) == before
    assert stats(slave)["replication_cut_bytes"] == "0"
    assert "CUT our tail" not in slave.log_text()
    impostor.close()


def test_an_impostor_claiming_no_secret_gets_no_proof(broker_factory, tmp_path):
    slave, before = slave_with_a_log(broker_factory, tmp_path / "s")
    impostor = FakeMaster(lambda peer: peer.send(rp.Challenge(False, proofs.new_nonce())))
    follow(slave, impostor.port)
    in_log(slave, "this slave requires its master to prove the secret, and the master holds no replication secret")
    wait_for(lambda: len(impostor.sessions) >= 2, 10, "the slave retried (so its first session is over)")
    frames = events_of(bytes(impostor.sessions[0].received))
    assert [type(f) for f in frames] == [rp.ErrorFrame], frames  # no PROOF: nothing to test guesses against
    assert commitlog(slave) == before
    impostor.close()


# -- replayed sessions ------------------------------------------------------------------------------------------------

class Relay:
    """A TCP relay in front of the master that records one session's bytes, each way."""

    def __init__(self, upstream_port):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.upstream_port = upstream_port
        self.up = bytearray()  # slave -> master
        self.down = bytearray()  # master -> slave
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        slave, _ = self.server.accept()
        self.server.close()
        master = socket.create_connection(("127.0.0.1", self.upstream_port))
        threading.Thread(target=self._pump, args=(master, slave, self.down), daemon=True).start()
        self._pump(slave, master, self.up)

    @staticmethod
    def _pump(src, dst, record):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                record += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def test_replayed_handshakes_fail_both_ways(broker_factory, tmp_path):
    master, rport = start_master(broker_factory, tmp_path, SECRET)
    with master.client() as c:
        c.put_ok("t-a", BODY, 0)
    relay = Relay(rport)
    slave = start_slave(broker_factory, tmp_path / "s", relay.port, SECRET)
    with slave.client() as c:
        wait_for(lambda: bodies(c) == [BODY], 15, "replicated through the relay")
    slave.stop()
    wait_for(lambda: stats(master)["replication_slaves"] == "0", 10, "the recorded session ended")
    up, down = bytes(relay.up), bytes(relay.down)
    assert [type(f) for f in events_of(down)[:3]] == [rp.Challenge, rp.Proof, rp.Epochs]
    assert BODY in down  # the recorded session did carry the log

    # the slave's recorded bytes, replayed to the master: its fresh CHALLENGE nonce makes the old proof wrong
    peer = Peer.connect(rport)
    peer.sock.sendall(up)
    got = peer.drain()
    assert [type(f) for f in events_of(got)] == [rp.Challenge, rp.ErrorFrame]
    assert BODY not in got
    in_log(master, "the master requires a replication secret and the proof of slave 1 is wrong")

    # the master's recorded bytes, replayed to the slave: its fresh nonce makes the old proof wrong, and the
    # recorded EPOCHS (agreed position 0) cuts nothing
    before = commitlog(slave)
    impostor = FakeMaster(lambda p: p.sock.sendall(down))
    follow(slave, impostor.port)
    in_log(slave, "not following master 127.0.0.1:%d: this slave requires its master to prove the secret, and its "
                  "proof is wrong" % impostor.port)
    assert commitlog(slave) == before and "CUT our tail" not in slave.log_text()
    with slave.client() as c:
        assert bodies(c) == [BODY]
        assert c.call(ev.Version(1)).code == 200
    impostor.close()
