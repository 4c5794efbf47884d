"""The Python client's named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

#: Largest client credentials file (``--credentials``, ``METAQ_CREDENTIALS``) or secret file a client reads.
MAX_CREDENTIALS_FILE_BYTES = 64 * 1024

#: Largest reply body a client accepts during the ``auth`` handshake (a nonce, a proof or a refusal's text).
MAX_AUTH_REPLY_BYTES = 4096

#: Seconds a client connection waits, after a broker refused its credentials (or could not prove it holds
#: them), before it offers them again; requests made meanwhile fail at once with the same ``Unauthenticated``.
CLIENT_AUTH_RETRY_S = 10.0

#: Longest a client connection's ``close`` waits for what was queued before it (a one-way send, pipelined requests
#: its writer thread had not written yet) to be written before the socket closes: past it what is left is dropped.
CLIENT_CLOSE_DRAIN_S = 5.0

#: Plaintext a client encrypts at a time before sending it (a TLS connection's write buffer is at most about this).
CLIENT_TLS_WRITE_BYTES = 256 * 1024

#: Records a consumer's fetcher remembers per partition (offset and id) to find where a broker's log and the
#: one it read diverge after a failover (client/divergence.py): per bit of a 64-bit offset, the first record read
#: in the current and in the previous block of that size, and the last one; the newest densely, older ones ever
#: sparser, back to where the fetcher began. Each is one probe at most, once per divergence.
MAX_FETCH_CHECKPOINTS = 129

#: Partitions whose fetchers' records read (``MAX_FETCH_CHECKPOINTS`` each) a consumer keeps after a rebalance
#: took them away, for the next fetcher of the same partition and offset (client/divergence.py ``ReadsKept``): a
#: failover unregisters a broker's partitions and registers them again, and without them a divergence found then
#: would go back by time (``DIVERGENCE_REWIND_MS``) instead of to the last record both logs hold. The oldest kept
#: is dropped past this many. A priority topic's partition takes one per level (client/priorities.py).
MAX_KEPT_FETCH_READS = 1024

#: When none of those records is held by the broker as read, a consumer goes back to the first message stored
#: this long before the oldest of them (client/divergence.py): longer than any election takes, so a new
#: master's first messages are not skipped (they are read again rather than lost).
DIVERGENCE_REWIND_MS = 120_000
