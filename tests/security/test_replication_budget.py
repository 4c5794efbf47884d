"""Issue 67 point 3: the replication port trusts no one early, and a proved peer no further than its membership
(real brokers; strangers and peers are raw sockets speaking our frames, with the secret when they play a member).

Before the proof a connection is a stranger: strangers count in a share of their own (REPLICATION_STRANGERS, per
address REPLICATION_STRANGERS_PER_ADDRESS) that never takes a slave's or a peer master's room, and only the
handshake's small frames are read (REPLICATION_HANDSHAKE_FRAME_BYTES, refused at the header). After it a peer is a
member ZooKeeper names, each of its calls held to what that member may ask (``mqttcluster.asks``)."""

import base64
import json
import os
import socket
import threading
import time

import pytest

from metaq import limits
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.server.replication import limits as replication_limits
from metaq.auth import proofs
from metaq.client.local import free_port, small_config
from metaq.mqtt.records import record_data
from metaq.mqttcluster.clientids.calls import PeerClient
from metaq.mqttcluster.clientids.ids import home_of
from metaq.protocol import replication as rp
from metaq.protocol.checksum import crc32
from metaq.serving.replication import handshake
from tests.harness.broker import wait_for
from tests.harness.faults import PauseProcess
from tests.harness.mqtt import Raw, mqtt_config
from tests.harness.mqttcluster import PaperMembers, homed
from tests.harness.replication import frames_of, master_config, stats

pytestmark = pytest.mark.integration

SECRET = "replication-secret-0123456789abcdef"
FLOODERS = ["127.0.0.%d" % i for i in range(2, 32)]  # 30 addresses, none the slave's or a peer's (127.0.0.1)


def frame(ftype, payload):
    """A frame of type ``ftype`` around ``payload`` as it is, whatever it holds."""
    head = rp.FRAME_HEADER.pack(rp.MAGIC, rp.VERSION, ftype, 0, len(payload), 0)
    crc = crc32(payload, crc32(head[:12]))
    return rp.FRAME_HEADER.pack(rp.MAGIC, rp.VERSION, ftype, 0, len(payload), crc) + payload


class Peer:
    """One raw connection to a replication port."""

    def __init__(self, port, source=None):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=source)
        self.parser = rp.ReplicationParser(max_data=1 << 20)

    def next(self, timeout=10.0):
        """The next frame; rp.CLOSED at the end or when nothing came within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            event = self.parser.next_event()
            if event is not rp.NEED_DATA:
                return event
            left = deadline - time.monotonic()
            if left <= 0:
                return rp.CLOSED
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return rp.CLOSED
            except ConnectionResetError:
                data = b""
            self.parser.receive_data(data)

    def open_now(self):
        """True while the broker has not closed this connection (nothing more is expected on it)."""
        self.sock.setblocking(False)
        try:
            return self.sock.recv(65536) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            self.sock.settimeout(10)

    def send(self, *events):
        self.sock.sendall(b"".join(rp.serialize(e) for e in events))

    def prove(self, broker_id, secret=SECRET):
        """Read the CHALLENGE and send the peers' PROOF for ``broker_id``; returns (challenge, our proof)."""
        challenge = self.next()
        assert isinstance(challenge, rp.Challenge), challenge
        ours, refusal = handshake.peer_proof(secret.encode(), challenge, broker_id)
        assert refusal is None
        self.send(ours)
        return challenge, ours

    def call(self, broker_id, request):
        """A first call as member ``broker_id`` (proved with the secret): the answer (a dict), or the ERROR."""
        self.prove(broker_id)
        return self.again(broker_id, request, first=True)

    def again(self, broker_id, request, first=False):
        self.send(rp.PeerCall(broker_id, json.dumps(request).encode()))
        if first:
            theirs = self.next()
            if isinstance(theirs, rp.ErrorFrame):
                return theirs
            assert isinstance(theirs, rp.Proof), theirs
        reply = self.next()
        return json.loads(reply.body) if isinstance(reply, rp.PeerReply) else reply

    def close(self):
        self.sock.close()


class Flood:
    """Idle connections that never prove anything, from each of ``sources``, ``per_source`` each, opened again as
    the broker closes them, until ``stop``: an attacker holding every slot it can get."""

    def __init__(self, port, sources, per_source):
        self.port, self.sources, self.per_source = port, sources, per_source
        self.held = {s: [] for s in sources}
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._fill()
        self._thread.start()
        return self

    def _fill(self):
        for source in self.sources:
            live = []
            for sock in self.held[source]:
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    data = None
                except OSError:
                    data = b""
                if data == b"":
                    sock.close()
                else:
                    live.append(sock)
            while len(live) < self.per_source:  # (one at a time: a burst past the listen backlog would wait for SYNs)
                try:
                    sock = socket.create_connection(("127.0.0.1", self.port), timeout=2, source_address=(source, 0))
                except OSError:
                    break
                sock.setblocking(False)
                live.append(sock)
                self.opened += 1
            self.held[source] = live

    def _run(self):
        while not self._stop.wait(0.1):
            self._fill()

    def stop(self):
        self._stop.set()
        self._thread.join()
        for socks in self.held.values():
            for sock in socks:
                sock.close()


def start_master(broker_factory, tmp_path, max_connections=64):
    rport = free_port()
    cfg = master_config(tmp_path / "m", rport)
    cfg["security"] = {"replication_secret": SECRET}
    cfg.setdefault("limits", {})["max_connections"] = max_connections
    return broker_factory(cfg, workdir=tmp_path / "m"), rport


# -- strangers' share ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_idle_strangers_never_keep_a_slave_out(broker_factory, tmp_path):
    """30 addresses hold 16 unproved connections each (the port's per-address cap), opened again as they close:
    past the connection cap and the port's headroom before the fix. A slave that starts meanwhile connects, and stays
    connected while the flood goes on past the strangers' deadline."""
    master, rport = start_master(broker_factory, tmp_path)
    flood = Flood(rport, FLOODERS[:10], limits.HEADROOM_PER_ADDRESS).start()
    try:
        time.sleep(limits.STRANGER_EVICTION_AGE_S + 0.5)
        wd = tmp_path / "s"
        cfg = small_config(os.path.join(str(wd), "data"))
        cfg["security"] = {"replication_secret": SECRET}
        broker_factory(cfg, workdir=wd, extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
        wait_for(lambda: stats(master)["replication_slaves"] == "1", 6, "the slave connected past the flood")
        time.sleep(replication_limits.REPLICATION_PROOF_TIMEOUT_S
                   + 1)  # the strangers closed at their deadline and back
        assert stats(master)["replication_slaves"] == "1"
        assert master.log_text().count("slave 1 connected") == 1
    finally:
        flood.stop()
    assert flood.opened > replication_limits.REPLICATION_STRANGERS


def test_strangers_per_address_and_in_all(broker_factory, tmp_path):
    """One address holds REPLICATION_STRANGERS_PER_ADDRESS unproved connections, the next one is closed at once;
    all addresses together REPLICATION_STRANGERS, a new one from an address holding fewer closing the oldest of the
    address holding the most (counted in stats: replication_strangers_evicted); each is closed at
    REPLICATION_PROOF_TIMEOUT_S."""
    master, rport = start_master(broker_factory, tmp_path)
    per = replication_limits.REPLICATION_STRANGERS_PER_ADDRESS
    peers = [Peer(rport, (FLOODERS[0], 0)) for _ in range(per + 1)]
    got = [p.next(2.0) for p in peers]
    assert all(isinstance(g, rp.Challenge) for g in got[:per]), got
    assert got[per] is rp.CLOSED  # closed before its CHALLENGE
    sources = FLOODERS[1:1 + replication_limits.REPLICATION_STRANGERS // per]
    more = [Peer(rport, (s, 0)) for s in sources for _ in range(per)]  # (opened well within the eviction age)
    for p in more:
        p.next(1.0)
    time.sleep(0.5)
    live = [p for p in peers + more if p.open_now()]
    assert len(live) == replication_limits.REPLICATION_STRANGERS, len(live)
    assert sum(p in live for p in peers) < per  # the address holding the most gave way to the others
    counts = stats(master)
    assert int(counts["replication_strangers"]) == replication_limits.REPLICATION_STRANGERS, counts
    assert int(counts["replication_strangers_evicted"]) >= per - sum(p in live for p in peers), counts
    started = time.monotonic()
    assert live[-1].next(replication_limits.REPLICATION_PROOF_TIMEOUT_S + 3) is rp.CLOSED
    assert time.monotonic() - started < replication_limits.REPLICATION_PROOF_TIMEOUT_S + 1
    for p in peers + more:
        p.close()


# -- before the proof only the handshake's small frames ----------------------------------------------------------

@pytest.mark.parametrize("ftype,length", [(rp.T_PEER_CALL, mqttcluster_limits.MQTT_CLUSTER_MAX_CALL_BYTES),
                                          (rp.T_ROUTES, mqttcluster_limits.MQTT_CLUSTER_ROUTES_BYTES)],
                         ids=["call", "routes"])
def test_a_large_frame_before_the_proof_is_refused_at_its_header(broker_factory, tmp_path, ftype, length):
    """A PEER_CALL of 32 MiB or a ROUTES of 4 MiB announced by its header after a PROOF: refused at once, before a
    byte of its body came (none is ever sent)."""
    _master, rport = start_master(broker_factory, tmp_path)
    peer = Peer(rport)
    peer.prove(1)
    peer.sock.sendall(rp.FRAME_HEADER.pack(rp.MAGIC, rp.VERSION, ftype, 0, length, 0))
    started = time.monotonic()
    event = peer.next(3.0)
    assert isinstance(event, rp.ErrorFrame), event
    assert "REPLICATION_HANDSHAKE_FRAME_BYTES" in event.text
    assert time.monotonic() - started < 2.0
    assert peer.next(2.0) is rp.CLOSED


@pytest.mark.parametrize("extra", [0, 1], ids=["at-the-limit", "past-it"])
def test_the_handshake_frame_limit_and_one_past_it(broker_factory, tmp_path, extra):
    """A PEER_CALL of REPLICATION_HANDSHAKE_FRAME_BYTES is read (and its proof, wrong, refused); one byte more is
    refused at its header."""
    _master, rport = start_master(broker_factory, tmp_path)
    peer = Peer(rport)
    peer.next()
    peer.send(rp.Proof(proofs.new_nonce(), "0" * 64))
    body = b" " * (replication_limits.REPLICATION_HANDSHAKE_FRAME_BYTES - 4 + extra)
    peer.sock.sendall(frame(rp.T_PEER_CALL, (1).to_bytes(4, "big") + body))
    event = peer.next(5.0)
    assert isinstance(event, rp.ErrorFrame), event
    if extra:
        assert "REPLICATION_HANDSHAKE_FRAME_BYTES" in event.text, event
    else:
        assert "proof of peer broker 1 is wrong" in event.text, event


def test_deeply_nested_routes_get_a_clear_error(broker_factory, tmp_path):
    """A ROUTES nested 50,000 deep (within the handshake's bound): an ERROR saying so, no RecursionError."""
    master, rport = start_master(broker_factory, tmp_path)
    peer = Peer(rport)
    peer.prove(1)
    peer.sock.sendall(frame(rp.T_ROUTES, b'{"broker":1,"filters":' + b"[" * 50000 + b"]" * 50000 + b"}"))
    event = peer.next(5.0)
    assert isinstance(event, rp.ErrorFrame), event
    assert "nested deeper" in event.text, event
    with master.client() as c:
        assert c.stats_dict()["replication_port"]  # still serving
    assert "RecursionError" not in master.log_text()


# -- after the proof: a member, asking what it may -----------------------------------------------------------------

def cluster(broker_factory, tmp_path, zk_connect, n=2):
    """``n`` masters (broker ids 1..n) of one MQTT cluster, sharing the replication secret, 64 connections each."""
    brokers = []
    for i in range(n):
        cfg = mqtt_config(tmp_path / ("b%d" % i))
        cfg["broker"]["id"] = i + 1
        cfg["zk"] = {"connect": zk_connect}
        cfg["replication"] = {"port": free_port()}
        cfg["security"] = {"replication_secret": SECRET}
        cfg.setdefault("limits", {})["max_connections"] = 64
        brokers.append(broker_factory(cfg, workdir=tmp_path / ("b%d" % i)))
    for b in brokers:
        wait_for(lambda b=b: stats(b).get("mqtt_cluster_members") == str(n), 30, "the cluster's members")
    return brokers


def still_open(raw, wait=0.5):
    """True when nothing closed ``raw`` within ``wait`` s (no DISCONNECT, no end)."""
    raw.sock.settimeout(wait)
    try:
        raw.read()
        return False
    except TimeoutError:
        return True


def rport(b):
    return b.config["replication"]["port"]


def test_peer_calls_held_to_membership(broker_factory, tmp_path, zk_connect):
    """A "broker 9" (the secret, no member) is refused before any call; member 2 may not take a device of broker 1
    whose home is broker 1 (give_up), nor hold more than MQTT_CLUSTER_ID_BATCH ids a call, and of its hold only the
    ids homed on broker 1 are registered; a call naming another broker than the link proved ends the link."""
    b1, _b2 = cluster(broker_factory, tmp_path, zk_connect)
    client_id = homed(1, 1, [1, 2], "meter")[0]
    device = Raw(b1)
    assert device.connect(client_id, clean_start=False, properties={"session_expiry_interval": 600}).reason_code == 0
    give_up = {"op": "give_up", "c": client_id, "clean": False, "u": None, "to": 9, "gen": 1}

    stranger = Peer(rport(b1))
    answer = stranger.call(9, give_up)
    assert isinstance(answer, rp.ErrorFrame) and "no member" in answer.text, answer
    stranger.close()
    member = Peer(rport(b1))
    answer = member.call(2, dict(give_up, to=2))
    assert "only its home may" in answer.get("error", ""), answer
    assert still_open(device)

    before = int(stats(b1)["mqtt_cluster_ids_homed"])
    ids = ["held-%d" % i for i in range(mqttcluster_limits.MQTT_CLUSTER_ID_BATCH + 1)]
    answer = member.again(2, {"op": "hold", "ids": ids})
    assert "MQTT_CLUSTER_ID_BATCH" in answer.get("error", ""), answer
    answer = member.again(2, {"op": "hold", "ids": ids[:mqttcluster_limits.MQTT_CLUSTER_ID_BATCH]})
    assert answer == {"drop": [], "cont": []}, answer
    mine = sum(1 for c in ids[:mqttcluster_limits.MQTT_CLUSTER_ID_BATCH] if home_of(c, [1, 2]) == 1)
    assert 0 < mine < mqttcluster_limits.MQTT_CLUSTER_ID_BATCH
    assert int(stats(b1)["mqtt_cluster_ids_homed"]) == before + mine

    member.send(rp.PeerCall(1, json.dumps(give_up).encode()))  # the link proved broker 2
    assert member.next(3.0) is rp.CLOSED
    assert still_open(device)


@pytest.mark.fault
def test_one_follow_per_member(broker_factory, tmp_path, zk_connect):
    """A second follow of member 2 ends the first one still served (a cut link): one table of positions per member.
    (Broker 2 itself is paused meanwhile, its own follow frozen: a member still, it follows again once back.)"""
    b1, b2 = cluster(broker_factory, tmp_path, zk_connect)
    wait_for(lambda: stats(b2).get("mqtt_cluster_peers_up") == "1", 30, "broker 2 follows broker 1")
    pause = PauseProcess(b2)
    pause.inject(10)
    try:
        follow_twice(b1)
    finally:
        pause.heal()


def follow_twice(b1):
    links = []
    for _ in range(2):
        link = Peer(rport(b1))
        link.prove(2)
        link.send(rp.Routes(2, ("a/#",), (), -1))
        assert isinstance(link.next(), rp.Proof)
        assert isinstance(link.next(), rp.Records)
        links.append(link)
    first = links[0]
    while True:  # its heartbeats until it ends
        event = first.next(3.0)
        if event is rp.CLOSED:
            break
        assert isinstance(event, rp.Records), event
    assert isinstance(links[1].next(3.0), rp.Records)
    for link in links:
        link.close()


@pytest.mark.slow
def test_strangers_never_keep_a_peer_out(broker_factory, tmp_path, zk_connect):
    """30 addresses hold 16 unproved connections each on broker 2's replication port (past its headroom of a
    cluster's before the fix): broker 1's follow of it stays up, and a CONNECT on broker 1 of an id homed on broker
    2 (a call over a new link) is served."""
    b1, b2 = cluster(broker_factory, tmp_path, zk_connect)
    wait_for(lambda: stats(b1).get("mqtt_cluster_peers_up") == "1", 30, "broker 1 follows broker 2")
    started = time.monotonic()
    flood = Flood(rport(b2), FLOODERS, limits.HEADROOM_PER_ADDRESS).start()  # every slot it can get, taken
    try:
        client_id = homed(1, 2, [1, 2], "valve")[0]
        codes = []
        deadline = started + 9  # (before the fix its first strangers were closed at 10 s, and their places retaken)
        while time.monotonic() < deadline:
            device = Raw(b1)
            codes.append(device.connect(client_id).reason_code)
            device.sock.close()
            if codes[-1] == 0:
                break
            time.sleep(0.5)
        assert codes[-1] == 0, codes
        assert stats(b1).get("mqtt_cluster_peers_up") == "1"
    finally:
        flood.stop()


class PaperHome:
    """A member of the cluster no broker runs (its ``replication`` node names this server): it answers every call
    with ``answer`` (a dict) after the callee's side of the handshake, and holds any other link open, silent."""

    def __init__(self, answer):
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.calls = []
        self._socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self._socks.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock):
        parser = rp.ReplicationParser()
        challenge = handshake.challenge(SECRET.encode())
        sock.sendall(rp.serialize(challenge))
        proof = None
        try:
            for event in frames_of(sock, parser):
                if isinstance(event, rp.Proof):
                    proof = event
                elif isinstance(event, rp.PeerCall):
                    self.calls.append(json.loads(event.body))
                    if proof is not None:
                        sock.sendall(rp.serialize(handshake.callee_proof(SECRET.encode(), challenge.nonce,
                                                                         proof.nonce, event.broker_id)))
                        proof = None
                    sock.sendall(rp.serialize(rp.PeerReply(json.dumps(self.answer).encode())))
        except OSError:
            return

    def close(self):
        self.listener.close()
        for sock in self._socks:
            sock.close()


def session(client_id, queued):
    """A handover of ``client_id`` as ``handover.export`` writes it, with ``queued`` QoS 1 messages for it."""
    flag, data = record_data("news", b"queued-while-away", 1, "sender", None)
    message = [1, "news", flag, base64.b64encode(bytes(data)).decode()]
    return {"c": client_id, "u": None, "v": 5, "e": 600, "subs": [["news", 1, False, ["news"], False, None]],
            "q2": [], "sh": [], "inf": [], "queued": [message] * queued, "dropped": 0}


@pytest.mark.parametrize("case", ["malformed", "past-the-cap", "another-id", "sound"])
def test_a_handover_is_checked_whole_before_anything_of_it_is_taken(broker_factory, tmp_path, zk_connect, case):
    """Broker 1's device connects; its id's home, member 2, answers the registration with a session: one without its
    messages' list, one of MQTT_HANDOVER_MAX_MESSAGES + 1 messages or another client id's is refused (0x88), nothing of
    it written and no KeyError; a sound one is taken (Session Present, its message delivered)."""
    client_id = homed(1, 2, [1, 2], "pump")[0]
    state = session(client_id, 1)
    if case == "malformed":
        del state["queued"]
    elif case == "past-the-cap":
        state = session(client_id, mqttcluster_limits.MQTT_HANDOVER_MAX_MESSAGES + 1)
    elif case == "another-id":
        state = session("someone-else", 1)
    home = PaperHome({"gen": 1, "session": state, "from": 2})
    members = None
    try:
        cfg = mqtt_config(tmp_path / "b1", cluster_start_hold_s=0)
        cfg["broker"]["id"] = 1
        cfg["zk"] = {"connect": zk_connect}
        cfg["replication"] = {"port": free_port()}
        cfg["security"] = {"replication_secret": SECRET}
        b1 = broker_factory(cfg, workdir=tmp_path / "b1")
        members = PaperMembers(zk_connect, {2: home.address})
        wait_for(lambda: stats(b1).get("mqtt_cluster_members") == "2", 15, "member 2")
        device = Raw(b1)
        ack = device.connect(client_id, clean_start=False, properties={"session_expiry_interval": 600})
        assert [c["op"] for c in home.calls][:1] == ["register"], home.calls
        if case == "sound":
            assert ack.reason_code == 0 and ack.session_present, ack
            publish = device.read()
            assert publish.payload == b"queued-while-away", publish
            return
        assert ack.reason_code == 0x88, ack
        assert "is refused: a malformed handover" in b1.log_text()
        assert "KeyError" not in b1.log_text() and "Traceback" not in b1.log_text()
        assert stats(b1)["mqtt_sessions"] == "0"
    finally:
        home.close()
        if members is not None:
            members.close()


def test_a_first_call_past_the_handshake_bound_goes_after_a_small_one(broker_factory, tmp_path, zk_connect):
    """A member's first call on a new link larger than REPLICATION_HANDSHAKE_FRAME_BYTES is sent once the link is
    proved (after an opening call), and answered."""
    b1, _b2 = cluster(broker_factory, tmp_path, zk_connect)
    members = PaperMembers(zk_connect, [7])
    try:
        wait_for(lambda: stats(b1).get("mqtt_cluster_members") == "3", 15, "member 7")
        client = PeerClient(7, SECRET.encode())
        try:
            pad = "x" * (replication_limits.REPLICATION_HANDSHAKE_FRAME_BYTES + 1)
            answer = client.call("127.0.0.1:%d" % rport(b1), {"op": "release", "ids": [], "pad": pad})
            assert answer == {}, answer
        finally:
            client.close()
    finally:
        members.close()
