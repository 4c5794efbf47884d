"""Message ids' layout: MetaQ's snowflake variant, what the broker makes (``store/msgid.py``) and clients read.

``id = ((ts_ms - TWEPOCH) << TIMESTAMP_SHIFT) | (broker_id << SEQUENCE_BITS) | seq``, with a 10-bit broker id and a
12-bit sequence. ``compose`` makes one, ``id_timestamp_ms`` and ``id_broker`` read its parts.
"""

TWEPOCH = 1303895660503
SEQUENCE_BITS = 12
BROKER_BITS = 10
SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1
BROKER_MASK = (1 << BROKER_BITS) - 1
TIMESTAMP_SHIFT = SEQUENCE_BITS + BROKER_BITS


def compose(ticks, broker_id, seq):
    """The id of sequence ``seq`` of broker ``broker_id`` in millisecond ``ticks`` since ``TWEPOCH``."""
    return (ticks << TIMESTAMP_SHIFT) | (broker_id << SEQUENCE_BITS) | seq


def id_timestamp_ms(msg_id):
    """The millisecond (since the Unix epoch) inside an id: when the broker stored the message."""
    return (msg_id >> TIMESTAMP_SHIFT) + TWEPOCH


def id_broker(msg_id):
    """The id of the broker that made ``msg_id``."""
    return (msg_id >> SEQUENCE_BITS) & BROKER_MASK
