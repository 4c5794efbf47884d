"""Replication's and automatic failover's named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

from metaq import limits

#: Connections on the replication port that have not proved the replication secret yet (a slave or a peer master
#: before its PROOF checked out, and every stranger), in all and from one address: counted apart
#: (``connections.Strangers``), within the port's headroom, so that they never take the slots of a slave or a peer
#: that proved it. At the cap in all the oldest of the address holding the most is closed for a new one once
#: STRANGER_EVICTION_AGE_S old (a slave or a peer proves within milliseconds), else the new one is refused.
REPLICATION_STRANGERS = limits.REPLICATION_HEADROOM // 2
REPLICATION_STRANGERS_PER_ADDRESS = 8
#: Seconds a connection on the replication port has, from its accept, to prove the secret (its PROOF and its first
#: frame after it: a slave's HELLO, a peer's ROUTES or PEER_CALL); past it the connection is closed.
REPLICATION_PROOF_TIMEOUT_S = 5.0
#: Bytes of one frame the replication port reads before its sender proved the secret (the handshake's frames: a
#: PROOF, a HELLO of MAX_REPLICATION_EPOCHS entries, a peer's first ROUTES part or PEER_CALL): a larger one is
#: refused at its header, before a byte of its body is read. Peers send a larger first request after a small one.
REPLICATION_HANDSHAKE_FRAME_BYTES = 128 * 1024

#: Most log bytes one replication DATA frame may carry (``metaq.protocol.replication``).
#: A chunk holds whole records and blank tails, so this must exceed the largest
#: record (MAX_BODY_BYTES + topic + 62 bytes of header) and the largest blank
#: tail (smaller than the record that caused the roll).
MAX_REPLICATION_DATA_BYTES = 16 * 1024 * 1024

#: What a master reads per DATA frame by default (``MessageStore.read_log`` max_bytes).
REPLICATION_READ_BYTES = 1024 * 1024

#: Longest text of a replication ERROR frame, in bytes.
MAX_REPLICATION_ERROR_TEXT = 4096

#: Most entries an epoch history may hold, on disk and in a HELLO/EPOCHS frame
#: (one entry per master start or promotion; 16 bytes each on the wire).
MAX_REPLICATION_EPOCHS = 4096

#: A nonce of the replication handshake (``CHALLENGE`` and ``PROOF`` frames, lowercase hex text): at least
#: 32 characters (16 random bytes), at most 64.
MIN_REPLICATION_NONCE_CHARS = 32
MAX_REPLICATION_NONCE_CHARS = 64

#: Longest proof of the replication secret in a ``PROOF`` frame (hex HMAC-SHA256: 64 characters).
MAX_REPLICATION_PROOF_CHARS = 64

# -- automatic failover (replication.ha: auto; docs/replication.md) -----------------------------------
#: Samples of the master's written end kept to judge whether a member is in sync (one per leader tick, 0.1 s):
#: enough for replication.insync_lag_ms up to 60 s.
MAX_INSYNC_SAMPLES = 600
#: Bytes of one ZooKeeper node the election reads (leader, insync, a candidate): a larger one is refused.
MAX_ELECTION_NODE_BYTES = 4096
#: Members of one broker id's group an insync node may list.
MAX_GROUP_MEMBERS = 64
#: Epochs a group's persistent epoch record (``ids/<id>/epochs``) keeps, the latest last: older ones are dropped
#: as new ones are added (only the latest decides who may be master).
MAX_RECORDED_EPOCHS = 64
#: Bytes of the epoch record node read or written: a larger one is refused (read: treated as unreadable).
MAX_EPOCH_RECORD_BYTES = 32768
