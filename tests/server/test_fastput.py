"""What a flush failure makes of a burst's replies (server/text/fastput.py)."""

from metaq.server.text.fastput import failed_replies


def test_every_reply_of_a_run_becomes_the_flush_error_with_its_opaque():
    opaques = [5, -6, 2147483647]  # a run's frames, as fastput records them for the flush wait
    assert failed_replies(opaques, b"flush failed") == (b"result 500 12 5\r\nflush failed"
                                                        b"result 500 12 -6\r\nflush failed"
                                                        b"result 500 12 2147483647\r\nflush failed")


def test_a_single_reply_too():
    assert failed_replies((1,), b"x") == b"result 500 1 1\r\nx"
