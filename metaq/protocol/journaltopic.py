"""The dead letters' resent journals (``%RESENT%<group>``, server/adminops.py): internal topics, written by the
broker alone. A client's put there would make ``dlq resend`` skip a dead letter it never resent (the journal
says which were), so every put path refuses these names, as it refuses the delay scheduler's topic."""

RESENT_PREFIX = "%RESENT%"
_RESENT_BYTES = RESENT_PREFIX.encode()


def is_journal(topic):
    """True for a resent journal's name (``str`` or ``bytes``, as the fast put paths hold it)."""
    if isinstance(topic, (bytes, bytearray, memoryview)):
        return bytes(topic[:len(_RESENT_BYTES)]) == _RESENT_BYTES
    return topic.startswith(RESENT_PREFIX)


def journal_refusal(topic):
    return ("%s is a broker's internal topic: the resent journal of a consumer group's dead letters "
            "(metaq-admin dlq resend writes it)" % topic)
