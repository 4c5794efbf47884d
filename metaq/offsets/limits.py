"""Committed offsets' named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

#: Committed consumer offsets the broker keeps, one per (group, topic, partition): a commit that would add
#: one more is refused (400). All are written at every checkpoint, so they are bounded like any state.
MAX_CONSUMER_OFFSETS = 100_000

# -- consumer offsets on the replication stream (the OFFSETS frame; docs/replication.md) ----------------
#: Committed offsets one OFFSETS frame may carry (the master's table, up to MAX_CONSUMER_OFFSETS entries, goes
#: in as many frames as it needs).
MAX_REPLICATION_OFFSETS_PER_FRAME = 1000
#: Bytes of entries one OFFSETS frame may carry (22 bytes and the two names each, and with owners 1 byte and the
#: owner's name: 1000 entries with 100-byte names fit; longer names and owners make more frames).
MAX_REPLICATION_OFFSETS_BYTES = 256 * 1024
