"""The replication handshake's decisions, with no I/O: what each side sends, and when it refuses.

The frames (``metaq.protocol.replication``)::

    master → slave   CHALLENGE  (secret held?, master nonce)                 on accept
    slave  → master  PROOF      (slave nonce, slave proof or "")             then HELLO (slave id, log end, epochs)
    master → slave   PROOF      ("", master proof or "")                     then EPOCHS, DATA...

A proof is ``metaq.auth.proofs.replication_proof(secret, side, master nonce, slave nonce, slave id)`` with
side ``"slave"`` or ``"master"``: it binds both fresh nonces (a proof recorded from another session fails)
and the slave id (a slave's proof cannot be replayed for another id). The slave proves first, to the one
master it is configured to follow; the master's proof goes out only to a slave that proved the secret, so a
stranger on the replication port gets nothing it could test guesses of the secret against offline. The
slave checks the master's proof before it acts on anything the master says (no cut of its log, no append).

Secrets on both sides: both prove. On neither: no proof, the link works as before (the configuration's
protected mode keeps such a link on loopback addresses). On one side only: refused, with a message naming
the missing side in both logs (``MASTER_REQUIRES`` / ``SLAVE_REQUIRES``).
"""

from metaq.auth import proofs
from metaq.protocol import replication as rp

__all__ = ["MASTER_REQUIRES", "SLAVE_REQUIRES", "challenge", "slave_proof", "check_slave", "check_follower",
           "master_proof", "check_master"]

MASTER_REQUIRES = "the master requires a replication secret"
SLAVE_REQUIRES = "this slave requires its master to prove the secret"
_SETTING = "security.replication_secret (or replication_secret_file)"


def challenge(secret):
    """The master's CHALLENGE for a new connection (a fresh nonce each time)."""
    return rp.Challenge(secret is not None, proofs.new_nonce())


def slave_proof(secret, challenge_, slave_id):
    """The slave's answer to ``challenge_``: ``(Proof to send before its HELLO, None)``, or ``(None, refusal)``
    when the slave will not go on (it holds a secret and the master says it holds none). A slave without a
    secret answers with no proof: the master refuses it if it requires one, and says so."""
    nonce = proofs.new_nonce()
    if secret is None:
        return rp.Proof(nonce, ""), None
    if not challenge_.secret:
        return None, ("%s, and the master holds no replication secret: set the same %s on the master"
                      % (SLAVE_REQUIRES, _SETTING))
    return rp.Proof(nonce, proofs.replication_proof(secret, "slave", challenge_.nonce, nonce, slave_id)), None


def check_slave(secret, master_nonce, proof, hello):
    """The master's check of a slave's PROOF and HELLO: None when it may be served, else why not."""
    return check_follower(secret, master_nonce, proof, hello.slave_id, "slave %d" % hello.slave_id)


def check_follower(secret, master_nonce, proof, ident, who):
    """The master's check of a follower's PROOF (a slave's, or a peer broker's following it for MQTT: ``ident`` its
    slave id or broker id, ``who`` names it in the refusal): None when it may be served, else why not."""
    kind = who.split(" ")[0]
    problem = rp.nonce_problem(proof.nonce)
    if problem is not None:
        return "the %s sent no usable nonce (%s)" % (kind, problem)
    if secret is None:
        return None
    if not proof.proof:
        return ("%s (%s) and %s offered no proof of it: set the master's secret on the %s"
                % (MASTER_REQUIRES, _SETTING, who, kind))
    expected = proofs.replication_proof(secret, "slave", master_nonce, proof.nonce, ident)
    if not proofs.same(proof.proof, expected):
        return "%s and the proof of %s is wrong: the %s's secret is not this master's" % (MASTER_REQUIRES, who, kind)
    return None


def master_proof(secret, master_nonce, slave_nonce, slave_id):
    """The master's PROOF, sent once the slave's checked out ("" with no secret)."""
    if secret is None:
        return rp.Proof("", "")
    return rp.Proof("", proofs.replication_proof(secret, "master", master_nonce, slave_nonce, slave_id))


def check_master(secret, master_nonce, slave_nonce, slave_id, proof):
    """The slave's check of the master's PROOF: None when it may follow that master, else why not."""
    if secret is None:
        return None
    if not proof.proof:
        return "%s, and it offered no proof" % SLAVE_REQUIRES
    expected = proofs.replication_proof(secret, "master", master_nonce, slave_nonce, slave_id)
    if not proofs.same(proof.proof, expected):
        return ("%s, and its proof is wrong: it does not hold this slave's secret (an impostor, or the two "
                "secrets differ)" % SLAVE_REQUIRES)
    return None
