"""Per-message acknowledgement's (POP) named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

#: Per-message acknowledgement (POP, metaq/pop/; docs/messaging.md "Per-message acknowledgement (POP)").
#: Messages one receive hands out at most (RocketMQ's proxy caps a receive's batch at 32).
POP_MAX_BATCH = 32
#: Messages of one group and topic handed out and not acknowledged at most (in flight, expired ones included): a
#: receive past it hands out only redeliveries.
POP_MAX_IN_FLIGHT = 4096
#: Offsets of one partition a group may be ahead of its lowest unacknowledged one: bounds the acknowledgements kept
#: out of order (one slow message does not let the set grow without end).
POP_MAX_SPAN = 8192
#: (group, topic) pairs the POP state holds at most: a receive for one more is refused (503).
POP_MAX_GROUPS = 1024
#: The invisible duration a receive or change_invisible may ask for, inclusive (RocketMQ: up to 12 hours).
POP_MIN_INVISIBLE_MS = 100
POP_MAX_INVISIBLE_MS = 12 * 3600 * 1000
#: Deliveries of one message before it goes to its group's dead-letter topic (RocketMQ's default is 16 retries).
POP_MAX_ATTEMPTS = 16
#: Bytes of POP journal records written since the last snapshot after which the next call writes a snapshot (the
#: journal's retention floor moves up to it).
POP_SNAPSHOT_BYTES = 8 << 20
#: Characters of a message group (FIFO) the POP state keeps; a longer name is kept as its start and a checksum.
POP_MAX_MESSAGE_GROUP_CHARS = 128
#: Receipt handles one ack takes at most (a text ack line holds them, comma-separated, within MAX_LINE_BYTES).
POP_MAX_ACK_HANDLES = 32
