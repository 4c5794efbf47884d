"""Issue 67 point 3, what a proved member may cost a broker: its RECORDS frames are decoded an entry at a time as
they are copied (the loop shared between them), its holds in a home's registry are bounded by a share of their own
(``MQTT_CLUSTER_HOLDER_SHARE``), and its registrations are for ids homed on the broker it asks (real brokers; the
member is a test's own server or raw socket, named a member in ZooKeeper)."""

import socket
import threading
import time

import pytest

from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.client.local import free_port
from metaq.protocol import replication as rp
from metaq.protocol.replication_mqtt import POSITION, Entry
from metaq.mqttcluster.clientids.ids import holder_share
from metaq.serving.replication import handshake
from tests.harness.broker import wait_for
from tests.harness.mqtt import Raw, mqtt_config
from tests.harness.mqttcluster import PaperMembers
from tests.harness.replication import stats
from tests.security.test_replication_budget import SECRET, Peer, homed, rport

pytestmark = pytest.mark.integration


def member_broker(broker_factory, tmp_path, zk_connect, **mqtt):
    """Broker 1 of an MQTT cluster with the replication secret (its other members: the test's)."""
    cfg = mqtt_config(tmp_path / "b1", cluster_start_hold_s=0, **mqtt)
    cfg["broker"]["id"] = 1
    cfg["zk"] = {"connect": zk_connect}
    cfg["replication"] = {"port": free_port()}
    cfg["security"] = {"replication_secret": SECRET}
    return broker_factory(cfg, workdir=tmp_path / "b1")


class PaperMaster:
    """Member 2 played by a server: it proves itself to the broker that follows it, then sends ``frames`` (each a
    RECORDS) and holds the link open with heartbeats."""

    def __init__(self, frames):
        self.frames = frames
        self.sent = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self._socks = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        self._socks.append(sock)
        parser = rp.ReplicationParser()
        challenge = handshake.challenge(SECRET.encode())
        try:
            sock.sendall(rp.serialize(challenge))
            proof = routes = None
            while routes is None:
                parser.receive_data(sock.recv(65536))
                while (event := parser.next_event()) is not rp.NEED_DATA:
                    proof = event if isinstance(event, rp.Proof) else proof
                    routes = event if isinstance(event, rp.Routes) else routes
            sock.sendall(rp.serialize(handshake.callee_proof(SECRET.encode(), challenge.nonce, proof.nonce,
                                                             routes.broker_id)) + rp.serialize(rp.Records(())))
            for data in self.frames:
                sock.sendall(data)
            self.sent.set()
            while True:
                time.sleep(1)
                sock.sendall(rp.serialize(rp.Records(())))
        except OSError:
            return

    def close(self):
        self.listener.close()
        for sock in self._socks:
            sock.close()


def tiny_entries_frame():
    """A RECORDS frame of MQTT_CLUSTER_FRAME_BYTES of the smallest entries (one position, over and over)."""
    entry = Entry(POSITION, "t", 0, 1)
    count = (mqttcluster_limits.MQTT_CLUSTER_FRAME_BYTES - 4) // 32
    return rp.serialize(rp.Records((entry,) * count))


class Bystander:
    """A client asking broker ``b`` for its stats, one request after another, keeping the slowest answer's time."""

    def __init__(self, b):
        self.b, self.slowest, self.answers = b, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        with self.b.client() as c:
            while not self._stop.is_set():
                started = time.monotonic()
                c.stats_dict()
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.answers += 1
                time.sleep(0.005)

    def stop(self):
        self._stop.set()
        self._thread.join(10)
        return self.slowest


def test_a_records_frame_of_tiny_entries_lets_other_clients_run(broker_factory, tmp_path, zk_connect):
    """Member 2 sends three RECORDS frames of MQTT_CLUSTER_FRAME_BYTES, each about half a million 32-byte entries:
    a client's requests meanwhile are each answered within 0.4 s (decoding one such frame whole took longer), and the
    follow stays up (what an older broker may send is not capped)."""
    frame = tiny_entries_frame()
    master = PaperMaster([frame] * 3)
    members = None
    try:
        b1 = member_broker(broker_factory, tmp_path, zk_connect)
        bystander = Bystander(b1)
        members = PaperMembers(zk_connect, {2: master.address})
        assert master.sent.wait(60), "the frames were not read"
        time.sleep(1.5)  # the last frame's entries are copied
        slowest = bystander.stop()
        assert bystander.answers > 10
        assert slowest < 0.4, "a client waited %.2f s for an answer" % slowest
        assert stats(b1).get("mqtt_cluster_peers_up") == "1"
        assert "Traceback" not in b1.log_text()
    finally:
        master.close()
        if members is not None:
            members.close()



def test_a_member_flooding_holds_leaves_room_for_new_devices(broker_factory, tmp_path, zk_connect):
    """Member 2 holds ids homed on broker 1, MQTT_CLUSTER_ID_BATCH a call, three times its share of broker 1's
    registry (mqtt.cluster_max_ids 2000): only its share is registered, the rest refused (counted in stats), and a
    new device homed on broker 1 connects there."""
    b1 = member_broker(broker_factory, tmp_path, zk_connect, cluster_max_ids=2000)
    members = PaperMembers(zk_connect, [2])
    try:
        wait_for(lambda: stats(b1).get("mqtt_cluster_members") == "2", 15, "member 2")
        share = holder_share(2000)
        flood = homed(3 * share, 1, [1, 2], "flood")
        member = Peer(rport(b1))
        batch = mqttcluster_limits.MQTT_CLUSTER_ID_BATCH
        for i in range(0, len(flood), batch):
            call = {"op": "hold", "ids": flood[i:i + batch]}
            answer = member.call(2, call) if i == 0 else member.again(2, call)
            assert answer == {"drop": [], "cont": []}, answer
        counts = stats(b1)
        assert counts["mqtt_cluster_ids_homed"] == str(share), counts
        assert counts["mqtt_cluster_holds_refused"] == str(2 * share), counts
        device = Raw(b1)
        assert device.connect(homed(1, 1, [1, 2], "newcomer")[0]).reason_code == 0
        assert stats(b1)["mqtt_cluster_ids_homed"] == str(share + 1)
        member.close()
    finally:
        members.close()


def test_a_registration_sent_to_another_home_is_refused(broker_factory, tmp_path, zk_connect):
    """Member 2 asks broker 1 to register a client id whose home is member 2: refused with a clear error, counted
    (mqtt_cluster_peer_calls_refused), nothing registered; one homed on broker 1 is registered."""
    b1 = member_broker(broker_factory, tmp_path, zk_connect)
    members = PaperMembers(zk_connect, [2])
    try:
        wait_for(lambda: stats(b1).get("mqtt_cluster_members") == "2", 15, "member 2")
        member = Peer(rport(b1))
        elsewhere = homed(1, 2, [1, 2], "gauge")[0]
        answer = member.call(2, {"op": "register", "c": elsewhere, "clean": True, "u": None})
        assert "whose home is broker 2: only its home registers it" in answer.get("error", ""), answer
        counts = stats(b1)
        assert counts["mqtt_cluster_ids_homed"] == "0" and counts["mqtt_cluster_peer_calls_refused"] == "1", counts
        here = homed(1, 1, [1, 2], "gauge")[0]
        assert "gen" in member.again(2, {"op": "register", "c": here, "clean": True, "u": None})
        assert stats(b1)["mqtt_cluster_ids_homed"] == "1"
        member.close()
    finally:
        members.close()
