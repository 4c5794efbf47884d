"""Reconnect storms: the calls between two brokers pipelined on one link (``calls.PeerClient``, ``serve_calls``), the
CONNECTs' registrations batched per home (``registrations.Registrations``)."""

import json
import subprocess
import sys
import time
from types import SimpleNamespace

import gevent
import gevent.server
import gevent.socket
import gevent.ssl as ssl
import pytest

from bench.mqtt_load import open_connections
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqttcluster.clientids.calls import PeerClient, PeerUnreachable, _send_without_waiting, serve_calls
from metaq.mqttcluster.clientids.ids import home_of
from metaq.mqttcluster.clientids.leases import Leases
from metaq.mqttcluster.clientids.registrations import Registrations
from metaq.mqttcluster.clientids.service import ClientIds
from metaq.protocol import replication as rp
from tests.harness.broker import wait_for
from tests.harness.mqttcluster import Cluster, PaperMembers, homed
from tests.harness.pki import Pki
from tests.harness.replication import frames_of, stats


def test_concurrent_connects_homed_on_another_broker_share_their_calls(broker_factory, tmp_path, zk_connect):
    """200 CONNECTs at once on broker 0, about half of their ids homed on broker 1: each is registered (every CONNACK
    0), in a few ``registers`` calls to broker 1, not one call each."""
    cluster = Cluster(broker_factory, tmp_path, zk_connect, 2).start()
    b0 = cluster[0]
    for b in cluster.brokers:
        wait_for(lambda b=b: stats(b).get("mqtt_cluster_members") == "2", 30, "the members")
    n, prefix = 200, "storm"
    remote = sum(home_of("%s-%d" % (prefix, i), [0, 1]) == 1 for i in range(n))
    assert remote > n // 4
    before = stats(b0)
    socks = open_connections(b0.config["mqtt"]["port"], n, prefix, clean=False)
    after = stats(b0)
    try:
        calls = int(after["mqtt_cluster_calls"]) - int(before["mqtt_cluster_calls"])
        assert calls <= 20, "%d calls for %d registrations with broker 1" % (calls, remote)
        batched = int(after["mqtt_cluster_registrations_batched"]) - int(before["mqtt_cluster_registrations_batched"])
        assert batched == remote, after
        assert int(after["mqtt_cluster_registration_batches"]) <= calls
    finally:
        for s in socks:
            s.close()


#: Members 7, 8 and 9 of a cluster of one real broker (broker 0), in a process of their own (gevent): 7 holds ids
#: homed on broker 0 and never answers a call (its address a listener that reads nothing), 8 and 9 register them.
#: Prints what each step saw.
WITHHELD = """
import json, sys, time
from gevent import monkey
monkey.patch_all()
import gevent, gevent.server
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqttcluster.clientids.calls import PeerClient, PeerUnreachable

address, silent, held, fresh = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
server = gevent.server.StreamServer(("127.0.0.1", silent), lambda sock, _a: gevent.sleep(60))
server.start()
out = {}
as7 = PeerClient(7, None, timeout_s=10)
for c in held:
    assert "error" not in as7.call(address, {"op": "register", "c": c, "clean": False, "u": None})


def register(client, c, timeout_s=10):
    started = time.monotonic()
    try:
        answer = client.call(address, {"op": "register", "c": c, "clean": False, "u": None}, timeout_s)
    except PeerUnreachable as exc:
        answer = {"unreachable": str(exc)}
    return dict(answer, took=time.monotonic() - started)


most = mqttcluster_limits.MQTT_CLUSTER_CALLS_IN_FLIGHT - mqttcluster_limits.MQTT_CLUSTER_LEASE_CONNECTIONS
as8 = PeerClient(8, None, timeout_s=10)
stuck = [gevent.spawn(register, as8, c) for c in held[:3]]  # 7 is asked to give these up: no answer for 2.5 s
gevent.sleep(0.2)
out["others"] = [register(as8, c) for c in fresh[:5]]  # on the same link meanwhile
stuck += [gevent.spawn(register, as8, c) for c in held[3:most]]  # the link's calls in flight at their bound
gevent.sleep(0.2)
out["in_flight"] = getattr(as8, "in_flight", lambda _a: None)(address)
out["past"] = register(as8, fresh[5], 0.5)  # one past: waits its bound, then the clear error
started = time.monotonic()
as8.call(address, {"op": "lease"}, 2, lease=True)
out["lease"] = time.monotonic() - started
mqttcluster_limits.MQTT_CLUSTER_CALLS_IN_FLIGHT += 2  # a caller that does not keep the bound: the callee keeps it
as9 = PeerClient(9, None, timeout_s=10)
over = [gevent.spawn(register, as9, c) for c in held[most:most + mqttcluster_limits.MQTT_CLUSTER_CALLS_IN_FLIGHT - 1]]
gevent.joinall(over, timeout=20)
out["over"] = [g.value for g in over]
gevent.joinall(stuck, timeout=20)
out["stuck"] = [g.value for g in stuck]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_a_withheld_answer_holds_back_no_other_call_on_the_link_and_the_bound_holds(broker_factory, tmp_path,
                                                                                    zk_connect):
    """Member 8's registrations of ids member 7 holds wait for 7, which never answers (2.5 s, HOLDER_TIMEOUT_S):
    meanwhile 8's other calls on the same link are answered at once; at MQTT_CLUSTER_CALLS_IN_FLIGHT calls in flight
    one more waits its own bound and is told why (a lease renewal still goes, in its own turn); a caller sending past
    the bound gets the callee's clear error for the one past, at once. The withheld calls each cost only their own
    wait."""
    (b,) = Cluster(broker_factory, tmp_path, zk_connect, 1).start().brokers
    address = "127.0.0.1:%d" % b.config["replication"]["port"]
    most = mqttcluster_limits.MQTT_CLUSTER_CALLS_IN_FLIGHT - mqttcluster_limits.MQTT_CLUSTER_LEASE_CONNECTIONS
    silent = gevent.server.StreamServer(("127.0.0.1", 0), lambda s, a: None)  # a free port, closed at once
    silent.start()
    port = silent.server_port
    silent.close()
    members = PaperMembers(zk_connect, {7: "127.0.0.1:%d" % port, 8: "127.0.0.1:1", 9: "127.0.0.1:1"})
    wait_for(lambda: stats(b).get("mqtt_cluster_members") == "4", 10, "7, 8 and 9 members")
    ids = homed(most + mqttcluster_limits.MQTT_CLUSTER_CALLS_IN_FLIGHT + 1 + 6, 0, [0, 7, 8, 9], "w")
    held, fresh = ids[:-6], ids[-6:]
    try:
        out = subprocess.run([sys.executable, "-c", WITHHELD, address, str(port), json.dumps(held), json.dumps(fresh)],
                             capture_output=True, text=True, timeout=90)
    finally:
        members.close()
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout)
    assert all("gen" in a and a["took"] < 1.0 for a in got["others"]), got["others"]
    assert got["in_flight"] == most, got
    past = got["past"]
    assert "MQTT_CLUSTER_CALLS_IN_FLIGHT" in past.get("unreachable", "") and 0.4 < past["took"] < 1.5, past
    assert got["lease"] < 1.0, got
    over = got["over"]
    refused = [a for a in over if "MQTT_CLUSTER_CALLS_IN_FLIGHT" in a.get("error", "")]
    assert len(refused) == 1 and refused[0]["took"] < 1.0, over
    assert all(a["took"] > 2.0 for a in over if a not in refused), over  # the others waited for 7 (withheld)
    assert all(2.0 < a["took"] < 6.0 and "error" in a for a in got["stuck"]), got["stuck"]


class LyingCallee:
    """A callee of calls that proves no secret and answers each call its ``answer(request) -> [answer dicts]`` says
    (any id, any order, none at all)."""

    def __init__(self, answer):
        self.answer = answer
        self.server = gevent.server.StreamServer(("127.0.0.1", 0), self._serve)
        self.server.start()
        self.address = "127.0.0.1:%d" % self.server.server_port

    def _serve(self, sock, _addr):
        parser = rp.ReplicationParser()
        sock.sendall(rp.serialize(rp.Challenge(False, "ab" * 16)))
        proved = False
        for event in frames_of(sock, parser):
            if isinstance(event, rp.PeerCall):
                if not proved:
                    sock.sendall(rp.serialize(rp.Proof("", "")))
                    proved = True
                for reply in self.answer(json.loads(event.body)):
                    sock.sendall(rp.serialize(rp.PeerReply(json.dumps(reply).encode())))

    def close(self):
        self.server.close()


@pytest.mark.integration  # a callee of its own on loopback
def test_an_answer_naming_no_call_in_flight_or_another_call_is_dropped_and_counted():
    """A callee that answers a call with another call's id, with its id but another op or client id, with an id no
    call has, or twice: each such answer is dropped and counted (``unmatched``), never taken by a call; the call it
    lied about takes its own answer, or times out on its own bound."""
    seen = []

    def answer(request):
        seen.append(request)
        i, op = request["id"], request["op"]
        if request.get("c") == "liar":  # answered as another op, then as another id, then as itself twice
            return [{"id": i, "op": "lease"}, {"id": i + 1000, "op": op, "c": "liar"},
                    {"id": i, "op": op, "c": "liar", "gen": 1}, {"id": i, "op": op, "c": "liar", "gen": 2}]
        if request.get("c") == "mute":
            return [{"id": i, "op": op, "c": "other", "gen": 9}]  # its id, another client id: never its answer
        return [{"id": i, "op": op, "c": request.get("c"), "gen": 5}]

    callee = LyingCallee(answer)
    client = PeerClient(3, None, timeout_s=2)
    try:
        first = client.call(callee.address, {"op": "register", "c": "a"})
        assert first == {"gen": 5}
        assert client.call(callee.address, {"op": "register", "c": "liar"}) == {"gen": 1}
        started = time.monotonic()
        with pytest.raises(PeerUnreachable):
            client.call(callee.address, {"op": "register", "c": "mute"}, 0.3)
        assert time.monotonic() - started < 1.0
        assert client.call(callee.address, {"op": "register", "c": "b"}) == {"gen": 5}  # the link goes on
        gevent.sleep(0.05)
        assert client.unmatched == 4  # the liar's three and the mute's one
        assert client.kept(callee.address) == 1
    finally:
        client.close()
        callee.close()


@pytest.mark.integration  # a callee of its own on loopback
def test_answers_in_any_order_each_go_to_the_call_their_id_names():
    """Calls in flight on one link answered last first: each call gets its own answer."""
    held = []

    def answer(request):
        held.append(request)
        if len(held) < 5:
            return []
        out = [{"id": r["id"], "op": r["op"], "c": r["c"], "n": r["c"]} for r in reversed(held)]
        del held[:]
        return out

    callee = LyingCallee(answer)
    client = PeerClient(3, None, timeout_s=5)
    try:
        calls = [gevent.spawn(client.call, callee.address, {"op": "register", "c": "c%d" % i}) for i in range(5)]
        gevent.joinall(calls, timeout=5)
        assert [g.value for g in calls] == [{"n": "c%d" % i} for i in range(5)]
        assert client.unmatched == 0
    finally:
        client.close()
        callee.close()


def test_registrations_to_one_home_go_in_batches_each_with_its_own_answer():
    """Registrations asked at once go in batches (at most MQTT_CLUSTER_REGISTER_BATCHES in flight, each of what
    queued meanwhile, at most MQTT_CLUSTER_ID_BATCH); each gets its own answer or its own error, in its own bound."""
    sent = []

    def send(home, requests, timeout_s):
        sent.append(len(requests))
        gevent.sleep(0.05)
        if home == "down":
            raise PeerUnreachable("no home")
        return [{"c": r["c"]} if r["c"] != "bad" else PeerUnreachable("its own") for r in requests]

    regs = Registrations(send, most=2)
    n = mqttcluster_limits.MQTT_CLUSTER_ID_BATCH + 500
    names = ["d%d" % i for i in range(n)] + ["bad"]
    calls = [gevent.spawn(regs.register, "h", {"c": c}, 5) for c in names]
    gevent.joinall(calls, timeout=10)
    assert [g.value for g in calls[:-1]] == [{"c": c} for c in names[:-1]]
    assert isinstance(calls[-1].exception, PeerUnreachable) and "its own" in str(calls[-1].exception)
    assert max(sent) == mqttcluster_limits.MQTT_CLUSTER_ID_BATCH and sum(sent) == n + 1 and len(sent) <= 5, sent
    short = gevent.spawn(regs.register, "h", {"c": "short"}, 0.02)
    long = gevent.spawn(regs.register, "h", {"c": "l"}, 5)
    gevent.joinall([short, long], timeout=5)  # in one batch: the short one told at its bound, the other answered
    assert isinstance(short.exception, PeerUnreachable) and long.value == {"c": "l"}
    down = [gevent.spawn(regs.register, "down", {"c": "x%d" % i}, 5) for i in range(3)]
    gevent.joinall(down, timeout=5)
    assert all(isinstance(g.exception, PeerUnreachable) for g in down)
    assert regs.batched == n + 1 + 2 + 3


def test_a_client_ids_registrations_go_one_at_a_time_in_the_order_they_came():
    """Registrations of one id asked at once never share a batch, and one goes only once the one before it is
    answered (the home decides them in order, each answer here before the next is asked); other ids' go meanwhile.
    One whose own bound runs out while it waits is told so at its bound; the one after it still goes."""
    sent = []

    def send(home, requests, timeout_s):
        sent.append([r["c"] for r in requests])
        gevent.sleep(0.05)
        return [{"n": r["n"]} for r in requests]

    regs = Registrations(send, most=1)
    order = [("x", 5), ("y", 5), ("x", 5), ("x", 0.02), ("x", 5), ("z", 5)]
    calls = [gevent.spawn(regs.register, "h", {"c": c, "n": n}, bound) for n, (c, bound) in enumerate(order)]
    gevent.joinall(calls, timeout=5)
    assert sent == [["x", "y", "z"], ["x"], ["x"]], sent  # the one whose bound ran out while it waited never went
    assert [g.value for g in calls] == [{"n": 0}, {"n": 1}, {"n": 2}, None, {"n": 4}, {"n": 5}]
    assert isinstance(calls[3].exception, PeerUnreachable)
    assert regs._ids == {} and regs._queues == {}


def test_a_lone_registration_goes_as_a_register_call_a_batch_of_more_as_registers():
    """A home of any version answers ``register``: a registration alone goes as one; two go as one ``registers``."""
    made = []

    def call(broker_id, address, request, timeout_s=None, exclusive=False):
        made.append(request["op"])
        return {"gen": 1} if request["op"] == "register" else {"a": [{"gen": 2}, {"gen": 3}]}

    ids = ClientIds(None, None, None, 3, SimpleNamespace(close=lambda: None, timeout_s=5), 100, 0, lambda: True)
    ids.members = {1: "h:1", 3: "h:3"}
    ids._call = call
    assert ids._send_registers(1, [{"op": "register", "c": "a", "clean": False}], 5) == [{"gen": 1}]
    two = [{"op": "register", "c": c, "clean": False} for c in ("a", "b")]
    assert ids._send_registers(1, two, 5) == [{"gen": 2}, {"gen": 3}]
    assert made == ["register", "registers"]


def test_a_home_answers_a_batchs_registrations_that_wait_for_nothing_in_its_turn_and_the_others_in_order():
    """A ``registers`` batch at the home: an id new or held by the caller (a reconnect where it was) is answered in the
    call's own turn; one held by another broker waits for its takeover, and a later entry of that id waits for it
    (the home decides one id's registrations in order); a malformed entry is answered with its error while the
    others are registered."""
    asked = []

    def call(broker_id, address, request, timeout_s=None, exclusive=False):
        asked.append((broker_id, request["op"], request["c"]))
        gevent.sleep(0.02)  # the holder's answer takes a round trip
        return {}

    home = ClientIds(None, None, None, 3, SimpleNamespace(close=lambda: None, timeout_s=5), 100, 0, lambda: True)
    home.members = {1: "h:1", 2: "h:2", 3: "h:3"}
    home._call = call
    home.registry.register("was-here", 1, 1, clean=False, checked=True)
    home.registry.register("elsewhere", 2, 2, clean=False, checked=True)
    batch = {"op": "registers", "r": [{"c": "elsewhere", "clean": False}, {"c": "new", "clean": True},
                                      {"c": "elsewhere", "clean": False}, {"clean": True},
                                      {"c": "was-here", "clean": False}]}
    register, inside = home._register, []

    def registering(caller, request):
        inside.append((request.get("c"), gevent.getcurrent() is serving))
        return register(caller, request)

    home._register, serving = registering, gevent.getcurrent()
    answers = home._registers(1, batch)["a"]
    assert sorted(inside, key=str) == sorted([("new", True), ("was-here", True), ("elsewhere", False),
                                              ("elsewhere", False)], key=str)
    gens = [a.get("gen") for a in answers]
    assert gens[1] < gens[4] < gens[0] < gens[2], answers  # the two at once first; the takeover's id in its order
    assert "KeyError" in answers[3]["error"], answers
    assert asked == [(2, "give_up", "elsewhere")]  # the second entry of the id found it held by the caller
    assert [home.registry.holder(c) for c in ("new", "was-here", "elsewhere")] == [1, 1, 1]
    assert home._serial == {}


class RealCallee(LyingCallee):
    """A callee answering by ``serve_calls`` (``answer``: its handlers), past a handshake without a secret."""

    def _serve(self, sock, addr):
        parser, first = _challenged(sock)
        sock.sendall(rp.serialize(rp.Proof("cd" * 16, "")))
        serve_calls(sock, parser, first, addr, self.answer)


def _challenged(sock):
    """A callee's side of a link's start without a secret, up to the caller's first call: ``(parser, that call)``."""
    parser = rp.ReplicationParser()
    sock.sendall(rp.serialize(rp.Challenge(False, "ab" * 16)))
    frames = frames_of(sock, parser)
    _proof, first = next(frames), next(frames)
    return parser, first


@pytest.mark.integration  # a callee of its own on loopback
def test_a_lease_renewal_waits_behind_no_greenlet_of_a_busy_loop():
    """Two seconds of other greenlets' turns queued in the loop (a broker ending thousands of connections): a lease
    renewal still goes, is answered and renews the lease within a fraction of it, on both sides, and the other
    calls' answers wait their turn."""
    heard = []
    callee = RealCallee({"lease": lambda caller, _request: heard.append(time.monotonic()) or {},
                         "register": lambda caller, request: {"n": request["c"]}})
    client = PeerClient(3, None, timeout_s=5)
    leases = Leases(3, 4.0)
    members = {0: callee.address, 3: "self"}
    ran, renewed = [], []
    leases.renewed = lambda home, sent: renewed.append(time.monotonic()) or Leases.renewed(leases, home, sent)

    def turn():  # a connection's end: a millisecond of CPU, and the loop not given away
        time.sleep(0.001)
        ran.append(time.monotonic())

    try:
        assert client.call(callee.address, {"op": "register", "c": "a"}) == {"n": "a"}  # the link is open
        busy = [gevent.spawn(turn) for _ in range(2000)]
        posted = time.monotonic()
        register = gevent.spawn(client.call, callee.address, {"op": "register", "c": "b"})
        leases.renew(members, call=None, post=client.post)
        gevent.joinall(busy + [register], timeout=30)
        assert len(ran) == 2000 and register.value == {"n": "b"}
        assert ran[-1] - posted > 1.5  # the loop was held that long
        assert heard and heard[0] - posted < 0.5  # answered by the callee at once
        assert renewed and renewed[0] - posted < 0.5  # and its answer taken at once
        assert leases.until[0] == pytest.approx(posted + 4.0, abs=0.1)  # from when it was sent
        assert not leases._renewing  # no greenlet of its own
    finally:
        client.close()
        callee.close()


def test_a_lease_renewal_goes_by_a_renewer_greenlet_when_no_link_is_open_and_once_at_a_time():
    """No link open: the renewal is a call of its own (which opens one); one posted unanswered within half the lease
    is not posted again; a home no longer a member is forgotten."""
    leases = Leases(3, 4.0)
    calls, posts = [], []

    def call(home, address, request, timeout_s):
        calls.append((home, request["op"], timeout_s))
        return {}

    leases.renew({0: "a:1"}, call, lambda address, request, then, timeout_s: False)
    gevent.sleep(0)
    assert calls == [(0, "lease", 2.0)]

    def post(address, request, then, timeout_s):
        posts.append((address, then))
        return True

    leases.renew({0: "a:1", 1: "b:1"}, call, post)
    leases.renew({0: "a:1", 1: "b:1"}, call, post)  # both in flight: not again
    assert [a for a, _ in posts] == ["a:1", "b:1"]
    posts[0][1]({})  # home 0 answered
    assert leases.until[0] > time.monotonic() + 3
    leases.renew({0: "a:1", 1: "b:1"}, call, post)
    assert [a for a, _ in posts] == ["a:1", "b:1", "a:1"]
    leases.renew({1: "b:1"}, call, post)
    assert 0 not in leases.until and 0 not in leases._posted


@pytest.mark.integration  # a callee of its own on loopback
def test_a_posted_call_unanswered_is_dropped_at_its_bound_and_its_link_ended():
    """A posted call the callee never answers: at its bound it is no longer in flight, and the link, silent since it
    was sent, is ended (the next call opens another)."""
    answered = []
    callee = LyingCallee(lambda request: [] if request["op"] == "lease" else [
        {"id": request["id"], "op": request["op"], "c": request.get("c")}])
    client = PeerClient(3, None, timeout_s=2)
    try:
        assert client.call(callee.address, {"op": "register", "c": "a"}) == {}
        assert not client.post("127.0.0.1:1", {"op": "lease"}, answered.append, 0.2)  # no link to it
        assert client.post(callee.address, {"op": "lease"}, answered.append, 0.2)
        assert client.in_flight(callee.address) == 1
        gevent.sleep(0.4)
        assert client.in_flight(callee.address) == 0 and client.kept(callee.address) == 0 and answered == [None]
        assert client.call(callee.address, {"op": "register", "c": "b"}) == {}
    finally:
        client.close()
        callee.close()


@pytest.mark.integration  # a callee of its own on loopback
def test_a_flood_of_lease_calls_on_one_link_shares_the_loop():
    """A peer that sends thousands of lease calls in one go: each is answered, and the callee's other greenlets run
    while they are (MAX_TURN_MS), not only once the last one is."""
    heard, ran = [], []

    def lease(_caller, _request):
        if not heard:  # another greenlet wants the loop from the first call on
            gevent.spawn(lambda: ran.append(len(heard)))
        heard.append(1)
        time.sleep(0.0001)  # a call's cost, on a slow machine
        return {}

    callee = RealCallee({"lease": lease})
    host, port = callee.address.split(":")
    sock = gevent.socket.create_connection((host, int(port)))
    parser = rp.ReplicationParser()
    try:
        frames = frames_of(sock, parser)
        next(frames)  # the challenge
        sock.sendall(rp.serialize(rp.Proof("ef" * 16, "")))
        n = 2000
        sock.sendall(b"".join(rp.serialize(rp.PeerCall(7, json.dumps({"op": "lease", "id": i}).encode()))
                              for i in range(n)))
        answers = [next(frames) for _ in range(n + 1)]  # its proof, then an answer to each
        assert isinstance(answers[0], rp.Proof) and len(heard) == n
        assert sorted(json.loads(a.body)["id"] for a in answers[1:]) == list(range(n))
        assert ran and ran[0] < n
    finally:
        sock.close()
        callee.close()


class DeafCallee(LyingCallee):
    """A callee that answers the first call of a link, then reads nothing more (its buffers fill)."""

    def _serve(self, sock, _addr):
        _parser, first = _challenged(sock)
        request = json.loads(first.body)
        sock.sendall(rp.serialize(rp.Proof("cd" * 16, "")) + rp.serialize(rp.PeerReply(json.dumps(
            {"id": request["id"], "op": request["op"], "c": request.get("c")}).encode())))
        gevent.sleep(30)


@pytest.mark.integration  # a callee of its own on loopback
def test_a_post_to_a_peer_that_reads_nothing_never_waits_and_fails_at_its_bound():
    """A posted call larger than the socket takes goes as far as it does at once, its rest by a greenlet (another
    post meanwhile is not taken: the writer is busy); the call is told it failed at its bound, and a link that died
    with a renewal posted lets the next one go at once."""
    callee = DeafCallee(None)
    client = PeerClient(3, None, timeout_s=5)
    told = []
    try:
        assert client.call(callee.address, {"op": "register", "c": "a"}) == {}
        started = time.monotonic()
        assert client.post(callee.address, {"op": "lease", "pad": "x" * 16_000_000}, told.append, 0.5)
        assert time.monotonic() - started < 0.2  # the caller's greenlet never waited for room
        assert not client.post(callee.address, {"op": "lease"}, told.append, 0.5)  # the rest is being written
        gevent.sleep(0.8)
        assert told == [None] and client.kept(callee.address) == 0
        leases = Leases(3, 4.0)
        renewers = []
        leases.renew({0: callee.address}, lambda *a: renewers.append(a), client.post)
        gevent.sleep(0)
        assert renewers  # no link open: a renewer greenlet opens one at once
    finally:
        client.close()
        callee.close()


def test_a_renewal_whose_link_died_is_posted_again_at_the_next_look():
    """A posted renewal told it failed (its link ended) no longer counts as in flight: the next look sends another,
    and an answer to a renewal forgotten since (the home left the members) renews nothing."""
    leases = Leases(3, 4.0)
    posts = []

    def post(address, request, then, timeout_s):
        posts.append(then)
        return True

    leases.renew({0: "a:1"}, None, post)
    posts[0](None)  # its link ended
    leases.renew({0: "a:1"}, None, post)
    assert len(posts) == 2
    leases.renew({}, None, post)  # the home left
    posts[1]({})
    assert 0 not in leases.until


@pytest.mark.integration  # a callee of its own on loopback
def test_a_posted_call_after_a_long_turn_of_the_loop_keeps_its_whole_bound():
    """A post made after half a second of work in one turn of the loop (its clock not moved since) is answered
    0.2 s later within a bound of 0.4 s: the bound runs from the post, not from the loop's last look at the clock."""
    def answer(request):
        gevent.sleep(0.2)
        return [{"id": request["id"], "op": request["op"], "c": request.get("c")}]

    callee = LyingCallee(answer)
    client = PeerClient(3, None, timeout_s=5)
    told = []
    try:
        assert client.call(callee.address, {"op": "register", "c": "a"}) == {}
        time.sleep(0.5)  # a long turn: the loop's clock stays where it was
        assert client.post(callee.address, {"op": "lease"}, told.append, 0.4)
        gevent.sleep(0.6)
        assert told == [{}]
    finally:
        client.close()
        callee.close()


@pytest.mark.parametrize("tls", [False, True])
def test_a_write_without_waiting_takes_what_the_socket_takes_and_the_rest_goes_after_it(tmp_path, tls):
    """To a peer that reads nothing, a write without waiting returns at once with what went (0 once the buffers
    are full); the rest sent after it from where it stopped (TLS: the same frame again, from its start) reaches the
    peer as one stream, byte for byte."""
    a, b = gevent.socket.socketpair()
    if tls:
        pki = Pki(tmp_path / "pki")
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(pki.server_cert, pki.server_key)
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
        shake = gevent.spawn(server.wrap_socket, b, server_side=True)
        a = client.wrap_socket(a)
        b = shake.get(timeout=10)
    a.settimeout(None)
    sent, frames = [], [bytes([i % 251]) * 300_000 for i in range(40)]
    try:
        for frame in frames:
            started = time.monotonic()
            went = _send_without_waiting(a, frame)
            assert time.monotonic() - started < 0.5 and 0 <= went <= len(frame)
            sent.append(frame)
            if went < len(frame):
                rest = gevent.spawn(a.sendall, frame if tls and went == 0 else frame[went:])
                break
        else:
            pytest.fail("the buffers never filled")
        got = bytearray()
        want = sum(len(f) for f in sent)
        while len(got) < want:
            got += b.recv(1 << 20)
        rest.get(timeout=10)
        assert bytes(got) == b"".join(sent) and a.gettimeout() is None
    finally:
        a.close()
        b.close()
