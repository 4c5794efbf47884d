"""What a flush failure makes of a burst's replies, and which frames a burst may take (server/text/fastput.py)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.server.text.fastput import failed_replies


def test_every_reply_of_a_run_becomes_the_flush_error_with_its_opaque():
    opaques = [5, -6, 2147483647]  # a run's frames, as fastput records them for the flush wait
    assert failed_replies(opaques, b"flush failed") == (b"result 500 12 5\r\nflush failed"
                                                        b"result 500 12 -6\r\nflush failed"
                                                        b"result 500 12 2147483647\r\nflush failed")


def test_a_single_reply_too():
    assert failed_replies((1,), b"x") == b"result 500 1 1\r\nx"


@settings(max_examples=300)
@given(st.lists(st.sampled_from([b"t", b"u", b"SCHEDULE_TOPIC_XXXX", b"t%P3", b"%RESENT%-x", b"secret", b"v"]),
                max_size=40),
       st.booleans(), st.booleans())
def test_the_frames_before_a_refused_topic_are_those_a_walk_frame_by_frame_finds(topics, shared, filtered):
    """``before_refused_topic`` with ``writable_topics`` (one decision per distinct topic of a burst) keeps exactly
    the frames before the first that the general path must answer: the delay scheduler's topic, a priority level,
    a resent journal, or a topic the user may not publish to."""
    from types import SimpleNamespace

    from metaq import errors
    from metaq.timers.levels import SCHEDULE_TOPIC
    from metaq.protocol.journaltopic import is_journal
    from metaq.priorities.wire import is_level_topic
    from metaq.serving.putpath import PutPath, WriteGate
    from metaq.serving.takers import before_refused_topic, writable_topics

    class Guard:
        enabled = filtered

        def require(self, session, action, kind, name):
            if name == "secret":
                raise errors.Forbidden("no")

    roles = SimpleNamespace(slave_refusal=None, unconfirmable_refusal=None, replication=None, election=None,
                            isolation_refusal=lambda: None)
    path = PutPath(None, None, None, None, roles, WriteGate(), guard=Guard())
    interned = {}
    frames = [((interned.setdefault(t, t) if shared else bytes(bytearray(t))), 0, 0, i, 0, 0, 0)
              for i, t in enumerate(topics)]
    first = next((i for i, t in enumerate(topics)
                  if t == SCHEDULE_TOPIC.encode() or is_level_topic(t) or is_journal(t)
                  or (filtered and t == b"secret")), len(topics))
    assert before_refused_topic(frames, writable_topics(path, None)) == frames[:first]
