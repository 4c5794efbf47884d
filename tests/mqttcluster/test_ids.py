"""A client id's home (rendezvous hash over the members) and the home's bounded registry
(metaq/mqttcluster/clientids/ids.py), and the PEER_CALL / PEER_REPLY frames of the replication stream."""

import pytest
from pydantic import ValidationError

from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.errors import RemoteProtocolError
from metaq.mqttcluster.clientids.ids import HomeRegistry, RegistryFull, holder_share, home_of
from metaq.mqttcluster.clientids.service import ClientIds
from metaq.protocol import replication as rp
from metaq.server.config import ServerConfig


def test_the_home_is_the_same_everywhere_and_moves_little():
    ids = ["dev-%d" % i for i in range(3000)]
    three = {c: home_of(c, [1, 2, 3]) for c in ids}
    assert three == {c: home_of(c, [3, 1, 2]) for c in ids}  # the members' order does not matter
    counts = [list(three.values()).count(m) for m in (1, 2, 3)]
    assert min(counts) > 800  # spread over the members
    four = {c: home_of(c, [1, 2, 3, 4]) for c in ids}
    moved = [c for c in ids if four[c] != three[c]]
    assert all(four[c] == 4 for c in moved)  # a member joining takes ids; none move between the others
    assert 500 < len(moved) < 1000
    assert home_of("x", []) is None


@pytest.mark.parametrize("client_id, of_eight, of_three", [
    ("dev-0", 2, 2), ("dev-1", 2, 2), ("meter-42", 4, 1), ("rc3-12345", 7, 1), ("\u00e9\u20ac-7", 6, 1), ("x", 4, 2)])
def test_the_home_is_the_one_every_version_computes(client_id, of_eight, of_three):
    """Brokers of two versions in one cluster (a rolling upgrade) must agree on each id's home: the weights are the
    8-byte BLAKE2b of "<member>\\0<client id>", these homes computed so."""
    assert home_of(client_id, range(8)) == of_eight
    assert home_of(client_id, {3: "c", 1: "a", 2: "b"}) == of_three


def test_the_registry_at_its_limit_and_past_it():
    r = HomeRegistry(2)
    assert r.register("a", 1, 7) is None and r.register("b", 2) is None
    with pytest.raises(RegistryFull):
        r.register("c", 1)  # one past it: refused, nothing changed
    assert len(r) == 2 and r.holder("c") is None
    assert r.register("a", 3, 8) == 1 and r.generation("a") == 8  # a known id moves at the limit
    assert r.hold("b", 2) is None and r.hold("a", 2) == 2  # a re-registration: the first holder keeps it
    r.release("a", 2)  # not its holder: kept
    assert r.holder("a") == 3
    r.release("a", 3)
    assert r.register("c", 1) is None
    r.drop_holder(2)
    assert r.holder("b") is None
    r.forget_unless(lambda c: c != "c")
    assert len(r) == 0


def test_one_holder_at_its_share_and_past_it():
    """A holder other than the home holds at most its share (mqtt.cluster_holder_share_percent of the registry): one
    id past it is refused (by ``register`` and ``hold``, nothing changed), the home's own ids and another holder's
    still go in, and an id it gives up or that moves away makes room again."""
    r = HomeRegistry(10, own=1)
    assert r.share == holder_share(10) == 10 * mqttcluster_limits.MQTT_CLUSTER_HOLDER_SHARE_PERCENT // 100 > 0
    for i in range(r.share):
        assert r.hold("two-%d" % i, 2) is None
    assert r.held_by(2) == r.share
    with pytest.raises(RegistryFull, match="its share"):
        r.hold("two-past", 2)
    with pytest.raises(RegistryFull, match="its share"):
        r.register("two-past", 2, 9)
    assert r.holder("two-past") is None and len(r) == r.share
    assert r.hold("two-0", 2) is None and r.register("two-0", 2, 3) == 2  # its own ids stand and go on
    assert r.register("three", 3, 4) is None and r.register("mine", 1, 5) is None
    assert r.register("two-1", 3, 6) == 2 and r.held_by(2) == r.share - 1  # moved away: room again
    assert r.register("two-past", 2, 7) is None
    r.release("two-past", 2)
    assert r.hold("back", 2, recovered=True) is None
    assert r.hold("three", 3, recovered=True) is None and r.hold("r", 3, recovered=True) is None
    with pytest.raises(RegistryFull, match="its share"):  # a recovered copy giving way would put it past its share
        r.hold("r", 2)
    assert r.holder("r") == 3 and r.held_by(2) == r.share
    own = HomeRegistry(10, own=1)
    for i in range(own.max_ids):  # the home's own devices: the whole registry
        own.register("own-%d" % i, 1)
    assert own.held_by(1) == own.max_ids > own.share
    assert holder_share(1) == 1


def test_the_holder_share_is_a_setting_within_its_bounds():
    """``mqtt.cluster_holder_share_percent``: 50 by default, 1 to 100; a home's registry holds a broker to it."""
    assert (ServerConfig().mqtt.cluster_holder_share_percent == mqttcluster_limits.MQTT_CLUSTER_HOLDER_SHARE_PERCENT
            == 50)
    for good in (1, 100):
        assert ServerConfig.model_validate({"mqtt": {"cluster_holder_share_percent": good}})
    for bad in (0, 101):
        with pytest.raises(ValidationError, match="cluster_holder_share_percent"):
            ServerConfig.model_validate({"mqtt": {"cluster_holder_share_percent": bad}})
    r = HomeRegistry(10, own=1, share_percent=20)
    r.register("a", 2)
    r.register("b", 2)
    with pytest.raises(RegistryFull, match="cluster_holder_share_percent"):
        r.register("c", 2)
    assert HomeRegistry(10, share_percent=100).share == 10 and HomeRegistry(10, share_percent=1).share == 1
    assert ClientIds(None, None, None, 1, None, 10, 0, lambda: True, share_percent=20).registry.share == 2


def test_a_recovered_copy_gives_way_to_a_live_one():
    """``hold``'s rule: a copy recovered at its holder's start gives way to one held live elsewhere, whichever told
    the home first; between two of one kind the first registered stands. It returns who ends its copy."""
    r = HomeRegistry(10)
    assert r.hold("unknown", 1, recovered=True) is None and r.holder("unknown") == 1  # an unknown id: registered
    assert r.recovered("unknown")
    assert r.hold("unknown", 1, recovered=True) is None and r.hold("unknown", 1) is None  # the same broker again
    assert not r.recovered("unknown")  # connected there since: live from now on
    assert r.hold("unknown", 1, recovered=True) is None and not r.recovered("unknown")  # and stays so
    assert r.hold("a", 1, recovered=True) is None
    assert r.hold("a", 2) == 1  # recovered, then live: the live one holds it, the recovered one ends
    assert r.holder("a") == 2 and not r.recovered("a") and r.generation("a") == 0
    assert r.hold("a", 1, recovered=True) == 1  # told again: still the recovered one ends
    assert r.hold("b", 2) is None
    assert r.hold("b", 1, recovered=True) == 1 and r.holder("b") == 2  # live, then recovered: the live one stands
    assert r.hold("c", 1, recovered=True) is None
    assert r.hold("c", 2, recovered=True) == 2 and r.holder("c") == 1  # both recovered: the first stands
    assert r.hold("d", 1) is None
    assert r.hold("d", 2) == 2 and r.holder("d") == 1  # both live: the first stands
    assert r.register("e", 3, 5) is None and not r.recovered("e")  # a CONNECT's registration is live
    assert r.hold("e", 1, recovered=True) == 1 and r.holder("e") == 3
    assert r.hold("f", 1, recovered=True) is None
    assert r.register("f", 1, 6) == 1 and not r.recovered("f")  # a CONNECT to the recovered copy: live
    assert r.hold("f", 2) == 2 and r.holder("f") == 1


def test_a_recovered_copy_at_the_registry_limit():
    r = HomeRegistry(1)
    assert r.hold("a", 1, recovered=True) is None
    with pytest.raises(RegistryFull):
        r.hold("b", 2)  # one past it: refused, nothing changed
    assert len(r) == 1 and r.holder("b") is None
    assert r.hold("a", 2) == 1 and len(r) == 1  # a known id moves to its live holder at the limit


def test_peer_frames_round_trip_and_their_bound():
    parser = rp.ReplicationParser()
    parser.receive_data(rp.serialize(rp.PeerCall(5, b'{"op":"register"}')) + rp.serialize(rp.PeerReply(b"{}")))
    assert parser.next_event() == rp.PeerCall(5, b'{"op":"register"}')
    assert parser.next_event() == rp.PeerReply(b"{}")
    with pytest.raises(ValueError):
        rp.serialize(rp.PeerReply(b"x" * (mqttcluster_limits.MQTT_CLUSTER_MAX_CALL_BYTES + 1)))
    frame = bytearray(rp.serialize(rp.PeerReply(b"{}")))
    frame[8:12] = (mqttcluster_limits.MQTT_CLUSTER_MAX_CALL_BYTES + 1).to_bytes(4, "big")  # a length past the bound
    bad = rp.ReplicationParser()
    bad.receive_data(bytes(frame))
    with pytest.raises(RemoteProtocolError):
        bad.next_event()


def test_the_registry_keeps_how_a_connect_began_each_holders_copy():
    """``clean``: True (Clean Start 1), False (Clean Start 0), None (not known: a recovered copy). A Clean Start 0
    CONNECT to the broker already holding the id continues its copy: how it began stands; a hold from the holder
    says it anew; a copy that moves takes what its new holder says."""
    r = HomeRegistry(10)
    assert r.clean("none") is None
    r.register("a", 1, 1, clean=True)
    assert r.clean("a") is True
    r.register("a", 1, 2, clean=False)  # the same broker, Clean Start 0: the copy begun by Clean Start 1 goes on
    assert r.clean("a") is True and r.generation("a") == 2
    r.register("a", 2, 3, clean=False)  # taken over elsewhere with Clean Start 0
    assert r.clean("a") is False
    r.register("a", 2, 4, clean=True)
    assert r.clean("a") is True
    assert r.hold("b", 1, recovered=True) is None and r.clean("b") is None  # recovered: not known
    assert r.hold("b", 2, clean=False) == 1 and r.clean("b") is False  # the live copy stands, as it says
    assert r.hold("b", 1, recovered=True) == 1 and r.clean("b") is False  # the standing copy's, unchanged
    assert r.hold("b", 2) is None and r.clean("b") is False  # its holder again, saying nothing: kept
    assert r.hold("b", 2, clean=True) is None and r.clean("b") is True  # its holder's word is newer
    assert r.hold("c", 3, clean=True) is None and r.clean("c") is True
