"""The client's reply → error map (metaq/client/replies.py), without a broker: what a caller catches."""

import pytest

from metaq import errors
from metaq.client.fetcher import records_of
from metaq.client.replies import reply_error
from metaq.protocol import events as ev
from metaq.protocol.text import error_reply
from metaq.protocol.text import TextParser


def reply_for(exc):
    """What the broker's text dispatcher answers for ``exc``, parsed back as a client reads it."""
    parser = TextParser()
    parser.receive_data(error_reply(exc, 7))
    return parser.next_event()


def test_a_corrupt_record_reply_becomes_a_corrupt_record_error_with_its_fields():
    sent = errors.CorruptRecord("orders", 3, 41, 42, position=123456)
    reply = reply_for(sent)
    assert isinstance(reply, ev.Result) and reply.code == 512 and reply.opaque == 7
    got = reply_error(reply, "get orders 0-3 41")
    assert isinstance(got, errors.CorruptRecord)
    assert (got.topic, got.partition, got.offset, got.next_offset, got.position) == ("orders", 3, 41, 42, 123456)
    with pytest.raises(errors.CorruptRecord) as info:
        records_of(reply)
    assert "partition 3 offset 41" in str(info.value)


def test_a_512_whose_text_is_not_ours_is_still_an_error_with_its_code():
    got = reply_error(ev.Result(512, b"something else", 1))
    assert isinstance(got, errors.BrokerError) and not isinstance(got, errors.CorruptRecord) and got.code == 512


def test_the_code_is_one_metaq_does_not_use():
    used = {200, 301, 400, 401, 403, 404, 500, 503, 504, errors.DiskFull.code}  # HttpStatus.java, and ours
    assert errors.CorruptRecord.code not in used
