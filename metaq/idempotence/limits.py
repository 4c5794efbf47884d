"""Idempotent producers' named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

# -- idempotent producers (put_idem; docs/spark.md "The idempotent producer") ------------------------------------------
#: Sequences of one producer-partition the broker remembers (``metaq.idempotence.window``): a resend of one of
#: them is answered as a duplicate; an older one is refused. The client never has more than this many
#: sequences of one partition unanswered, so its resends always fall inside.
IDEMPOTENCE_WINDOW = 1024
#: Most messages one ``putb_idem`` frame (a batch of idempotent puts: idempotence/wire.py) may carry: past it the
#: batch is refused whole (400). A batch is answered once, so its sequences are all unanswered while it is in
#: flight: the window bounds it, and a resent batch's duplicates are all answered with their original offsets.
MAX_IDEMPOTENT_BATCH_MESSAGES = IDEMPOTENCE_WINDOW
#: Producer-partitions ``(pid, topic, partition)`` the broker keeps windows for; past it the least recently
#: written is evicted (its resends are then stored again, as a new producer's). Worst case about 25 KiB each.
MAX_IDEMPOTENT_PRODUCERS = 4096
#: Default of ``store.producer_ttl_s`` in ms: a producer-partition with no record for this long (by the
#: records' store times) is forgotten (Kafka's transactional.id.expiration default: one day).
IDEMPOTENT_PRODUCER_TTL_MS = 86_400_000
#: A store checkpoint writes the idempotent producers' snapshot when their table changed, or else once the log
#: grew this much since the last one: a restart replays at most about this much log (``mmap.find`` skips log
#: without an idempotent record at memory speed) while a broker without idempotent producers writes it rarely.
IDEMPOTENCE_SNAPSHOT_BYTES = 64 << 20
#: Evicted producer-partitions whose owner the table remembers (``metaq.idempotence.window``), so that such a
#: producer's next put is refused with its reason (its window went past its user's quota) rather than stored as
#: a new producer's; past it the oldest is forgotten. 24 bytes and a topic name each.
MAX_EVICTED_PRODUCERS = 4096
