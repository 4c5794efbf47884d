"""What a flush failure makes of a burst's replies (server/fastput.py)."""

import pytest

from metaq.server.text.fastput import failed_replies


def test_every_reply_of_a_run_becomes_the_flush_error_with_its_opaque():
    run = b"result 200 7 5\r\n1 0 123result 200 9 -6\r\n22 3 4567result 200 5 2147483647\r\n9 1 0"
    assert failed_replies(run, b"flush failed") == (b"result 500 12 5\r\nflush failed"
                                                    b"result 500 12 -6\r\nflush failed"
                                                    b"result 500 12 2147483647\r\nflush failed")


def test_a_single_reply_too():
    assert failed_replies(b"result 200 5 1\r\n1 0 0", b"x") == b"result 500 1 1\r\nx"


def test_anything_else_is_refused():
    with pytest.raises(ValueError):
        failed_replies(b"value 3 1\r\nabc", b"x")
