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

__all__ = ["MASTER_REQUIRES", "SLAVE_REQUIRES", "challenge", "slave_proof", "check_slave", "master_proof",
           "check_master", "peer_proof", "check_peer", "callee_proof", "check_callee"]

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
    problem = rp.nonce_problem(proof.nonce)
    if problem is not None:
        return "the slave sent no usable nonce (%s)" % problem
    if secret is None:
        return None
    if not proof.proof:
        return ("%s (%s) and slave %d offered no proof of it: set the master's secret on the slave"
                % (MASTER_REQUIRES, _SETTING, hello.slave_id))
    expected = proofs.replication_proof(secret, "slave", master_nonce, proof.nonce, hello.slave_id)
    if not proofs.same(proof.proof, expected):
        return "%s and the proof of slave %d is wrong: the slave's secret is not this master's" % (MASTER_REQUIRES,
                                                                                                 hello.slave_id)
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


# -- peers: one master of an MQTT cluster linked to another (metaq.mqttcluster: a call link, a follow link) ---------
#
#     callee → caller   CHALLENGE  (secret held?, callee nonce)                on accept, as to a slave
#     caller → callee   PROOF      (caller nonce, caller proof or "")          then PEER_CALL (its broker id, request)
#                                                                              or ROUTES (its broker id, filters)
#     callee → caller   PROOF      ("", callee proof or "")                    then PEER_REPLY / RECORDS
#
# The same secret and checks as a slave's, bound to the caller's broker id and to their own sides ("peer",
# "peer-callee"), so a slave's proof never passes for a peer's nor the other way round.


def peer_proof(secret, challenge_, broker_id):
    """The caller's PROOF (as ``slave_proof``, side ``peer``): ``(Proof, None)`` or ``(None, refusal)``."""
    nonce = proofs.new_nonce()
    if secret is None:
        return rp.Proof(nonce, ""), None
    if not challenge_.secret:
        return None, "this broker holds a replication secret and the peer holds none: set the same %s" % _SETTING
    return rp.Proof(nonce, proofs.replication_proof(secret, "peer", challenge_.nonce, nonce, broker_id)), None


def check_peer(secret, callee_nonce, proof, broker_id):
    """The callee's check of a caller's PROOF: None when its calls may be answered, else why not."""
    problem = rp.nonce_problem(proof.nonce)
    if problem is not None:
        return "the peer sent no usable nonce (%s)" % problem
    if secret is None:
        return None
    if not proof.proof:
        return "%s (%s) and peer broker %d offered no proof of it" % (MASTER_REQUIRES, _SETTING, broker_id)
    expected = proofs.replication_proof(secret, "peer", callee_nonce, proof.nonce, broker_id)
    if not proofs.same(proof.proof, expected):
        return "%s and the proof of peer broker %d is wrong: its secret is not this broker's" % (MASTER_REQUIRES,
                                                                                                broker_id)
    return None


def callee_proof(secret, callee_nonce, caller_nonce, broker_id):
    """The callee's PROOF, sent once the caller's checked out ("" with no secret)."""
    if secret is None:
        return rp.Proof("", "")
    return rp.Proof("", proofs.replication_proof(secret, "peer-callee", callee_nonce, caller_nonce, broker_id))


def check_callee(secret, callee_nonce, caller_nonce, broker_id, proof):
    """The caller's check of the callee's PROOF: None when its answers may be acted on, else why not."""
    if secret is None:
        return None
    if not proof.proof:
        return "the peer offered no proof of the replication secret"
    expected = proofs.replication_proof(secret, "peer-callee", callee_nonce, caller_nonce, broker_id)
    if not proofs.same(proof.proof, expected):
        return "the peer's proof of the replication secret is wrong (an impostor, or the two secrets differ)"
    return None
