"""What the fast path's takers share (``fastput.FastPuts.take`` runs one per command word with a burst scanner: plain
puts in ``fastput.py``, each feature's in its ``fasttext.py``): what one pass did, and which topics of a burst the
connection's user may write (``PutPath.write_refusal``, asked once per topic of the burst).
"""

#: What one pass of the fast path did: MORE, it took every frame it scanned and stopped at its frame cap (there
#: may be more: ``FastPuts.take`` scans again with twice the cap), else DONE.
DONE, MORE = 0, 1


def writable_topics(path, session):
    """A ``topic bytes -> bool`` for one burst: True when ``path.write_refusal`` lets ``session``'s user put to
    the topic, asked once per topic of the burst (the general path answers the others, as it always does)."""
    answers = {}

    def may_write(topic):
        allowed = answers.get(topic)
        if allowed is None:
            allowed = answers[topic] = path.write_refusal(topic.decode("utf-8", "replace"), session) is None
        return allowed

    return may_write


def before_refused_topic(frames, may_write):
    """The frames before the first whose topic ``may_write(topic bytes) -> bool`` refuses (``writable_topics``)."""
    seen = None
    for i, frame in enumerate(frames):
        topic = frame[0]
        if topic is not seen:  # consecutive frames of one topic share the object: one call per run
            if not may_write(topic):
                return frames[:i]
            seen = topic
    return frames
