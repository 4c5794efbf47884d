"""A record's tags and their hash in the index unit (protocol/tags.py)."""

from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.tags import tag_code, tags_of_attribute


def test_tags_are_the_attribute_before_the_separator():
    assert tags_of_attribute(b"TagA\x02KEYS\x01k") == b"TagA"
    assert tags_of_attribute(b"color=red") == b"color=red"
    assert tags_of_attribute(b"\x02METAQ_PID\x017") == b""
    assert tag_code(b"") == 0 and tag_code(b"TagA") == metaq_checksum(b"TagA")
