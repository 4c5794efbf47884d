"""The replication handshake's decisions (metaq.serving.replication.handshake), no network: who proves what,
and the refusals, played frame by frame through the real codec."""

import pytest

from metaq.server.replication import limits as replication_limits
from metaq.auth import proofs
from metaq.protocol import replication as rp
from metaq.serving.replication import handshake

SECRET = b"the-replication-secret-0123456789"
OTHER = b"another-replication-secret-98765"


def wire(event):
    """``event`` after a trip through the codec (what the other side gets)."""
    p = rp.ReplicationParser()
    p.receive_data(rp.serialize(event))
    return p.next_event()


def hello(slave_id=3):
    return rp.Hello(slave_id, 7, 1 << 20, 0)


def run(master_secret, slave_secret, slave_id=3):
    """One whole exchange: ``(master's refusal, slave's refusal)``; each None when that side is satisfied."""
    challenge = wire(handshake.challenge(master_secret))
    ours, refusal = handshake.slave_proof(slave_secret, challenge, slave_id)
    if refusal is not None:
        return None, refusal
    refusal = handshake.check_slave(master_secret, challenge.nonce, wire(ours), wire(hello(slave_id)))
    if refusal is not None:
        return refusal, None
    theirs = wire(handshake.master_proof(master_secret, challenge.nonce, ours.nonce, slave_id))
    return None, handshake.check_master(slave_secret, challenge.nonce, ours.nonce, slave_id, theirs)


def test_same_secret_both_sides_prove():
    assert run(SECRET, SECRET) == (None, None)


def test_no_secret_anywhere_works_as_before():
    assert run(None, None) == (None, None)
    assert handshake.challenge(None).secret is False


def test_wrong_secret_is_refused_by_the_master_first():
    master, slave = run(SECRET, OTHER)
    assert handshake.MASTER_REQUIRES in master and "proof of slave 3 is wrong" in master
    assert slave is None  # it never got to see a proof of the master's


def test_slave_without_secret_is_refused_by_a_master_that_has_one():
    master, _ = run(SECRET, None)
    assert master.startswith(handshake.MASTER_REQUIRES) and "offered no proof" in master


def test_slave_with_secret_will_not_follow_a_master_without_one():
    master, slave = run(None, SECRET)
    assert master is None
    assert slave.startswith(handshake.SLAVE_REQUIRES) and "holds no replication secret" in slave


def test_slave_sends_no_proof_to_a_master_that_claims_no_secret():
    ours, refusal = handshake.slave_proof(SECRET, rp.Challenge(False, proofs.new_nonce()), 3)
    assert ours is None and refusal.startswith(handshake.SLAVE_REQUIRES)


def test_nonces_are_fresh():
    assert handshake.challenge(SECRET).nonce != handshake.challenge(SECRET).nonce
    c = handshake.challenge(SECRET)
    assert handshake.slave_proof(SECRET, c, 1)[0] != handshake.slave_proof(SECRET, c, 1)[0]


def test_a_slave_proof_is_bound_to_the_master_nonce():
    """A proof recorded from an earlier session fails against this session's CHALLENGE."""
    old = handshake.challenge(SECRET)
    recorded, _ = handshake.slave_proof(SECRET, old, 3)
    new = handshake.challenge(SECRET)
    refusal = handshake.check_slave(SECRET, new.nonce, recorded, hello(3))
    assert refusal is not None and "proof of slave 3 is wrong" in refusal
    assert handshake.check_slave(SECRET, old.nonce, recorded, hello(3)) is None  # the control


def test_a_slave_proof_is_bound_to_the_slave_id():
    c = handshake.challenge(SECRET)
    ours, _ = handshake.slave_proof(SECRET, c, 3)
    assert "proof of slave 4 is wrong" in handshake.check_slave(SECRET, c.nonce, ours, hello(4))


def test_a_master_proof_is_bound_to_the_slave_nonce_and_id():
    """An impostor replaying a real master's recorded PROOF to a new connection of the slave fails."""
    c = handshake.challenge(SECRET)
    slave_nonce = proofs.new_nonce()
    recorded = handshake.master_proof(SECRET, c.nonce, slave_nonce, 3)
    assert handshake.check_master(SECRET, c.nonce, slave_nonce, 3, recorded) is None  # the control
    assert "its proof is wrong" in handshake.check_master(SECRET, c.nonce, proofs.new_nonce(), 3, recorded)
    assert "its proof is wrong" in handshake.check_master(SECRET, c.nonce, slave_nonce, 4, recorded)


def test_the_two_sides_proofs_differ():
    """A slave's own proof echoed back is not the master's."""
    c = handshake.challenge(SECRET)
    ours, _ = handshake.slave_proof(SECRET, c, 3)
    echoed = rp.Proof("", ours.proof)
    assert "its proof is wrong" in handshake.check_master(SECRET, c.nonce, ours.nonce, 3, echoed)


@pytest.mark.parametrize("proof", ["", "0" * 64, "ab" * 31, "5f3c" * 8])  # the last: a nonce-sized stranger
def test_wrong_master_proofs(proof):
    refusal = handshake.check_master(SECRET, proofs.new_nonce(), proofs.new_nonce(), 3, rp.Proof("", proof))
    assert refusal.startswith(handshake.SLAVE_REQUIRES)


def test_master_refuses_a_proof_without_a_nonce_even_with_no_secret():
    refusal = handshake.check_slave(None, proofs.new_nonce(), rp.Proof("", ""), hello())
    assert "no usable nonce" in refusal


def test_proofs_fit_the_frame_limits():
    c = handshake.challenge(SECRET)
    ours, _ = handshake.slave_proof(SECRET, c, 2**31 - 1)
    assert len(ours.proof) == replication_limits.MAX_REPLICATION_PROOF_CHARS
    assert (replication_limits.MIN_REPLICATION_NONCE_CHARS <= len(ours.nonce)
            <= replication_limits.MAX_REPLICATION_NONCE_CHARS)
    assert wire(ours) == ours


def test_a_slave_proof_never_passes_for_a_peer_nor_a_peer_proof_for_a_slave():
    """A peer master's follow link (ROUTES) and call link (PEER_CALL) prove the secret with the peers' sides; a
    slave's proof over the same id fails there, and a peer's fails as a slave's."""
    c = wire(handshake.challenge(SECRET))
    as_slave, _ = handshake.slave_proof(SECRET, c, 3)
    as_peer, _ = handshake.peer_proof(SECRET, c, 3)
    assert handshake.check_peer(SECRET, c.nonce, wire(as_peer), 3) is None  # the control
    assert "is wrong" in handshake.check_peer(SECRET, c.nonce, wire(as_slave), 3)
    assert "is wrong" in handshake.check_slave(SECRET, c.nonce, wire(as_peer), hello(3))
    callee = wire(handshake.callee_proof(SECRET, c.nonce, as_peer.nonce, 3))
    assert handshake.check_callee(SECRET, c.nonce, as_peer.nonce, 3, callee) is None
    master = wire(handshake.master_proof(SECRET, c.nonce, as_peer.nonce, 3))
    assert "is wrong" in handshake.check_callee(SECRET, c.nonce, as_peer.nonce, 3, master)
