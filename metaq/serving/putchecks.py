"""What the text front-end checks of a message it is given to store (put, put_delayed, put_idem, request, reply),
in one place: the checksum, the attribute block, the broker's reserved properties, and a compressed body
decompressed on arrival (docs/rocketmq.md "Compressed bodies")."""

from metaq import errors
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import decode_payload, encode_payload
from metaq.protocol.properties import (PID_PROPERTY, SEQ_PROPERTY, SYSFLAG_MARK, compression_bits, has_identity,
                                       without_compression)
from metaq.loop.inflate import inflate_body

__all__ = ["verified_checksum", "uncompressed"]


def verified_checksum(e, attribute=True):
    """The put body's checksum, after checking it against the announced one and (``attribute``) the attribute
    block's shape and that it holds no put_idem property (a put_idem's is checked as the identity is added)."""
    body = e.body
    checksum = metaq_checksum(body)
    if e.checksum != checksum and e.checksum != ev.UNCHECKED:
        raise errors.ChecksumMismatch(
            "Checksum failure, message may be corrupted when transferring on network "
            "(announced %d, body has %d)" % (e.checksum, checksum))
    if attribute and e.flag & 1:  # a malformed attribute block is refused, not stored; so are the identity's
        if has_identity(decode_payload(e.flag, body)[0]):
            raise errors.ClientError("%s and %s are reserved properties: send with put_idem instead"
                                     % (PID_PROPERTY, SEQ_PROPERTY))
    return checksum


def uncompressed(e, max_body):
    """``e`` with its body decompressed when its attribute's ``@SYSFLAG`` marks it compressed (the metaq
    Producer's ``compress_over``), those bits taken out of the attribute; ``e`` itself otherwise. Called once
    the checksum of what was sent is verified; the new body gets its own checksum. BadCompressedBody (400)."""
    body = e.body
    if not e.flag & 1 or len(body) < 4:
        return e
    alen = int.from_bytes(body[:4], "big", signed=True)
    if alen <= 0 or SYSFLAG_MARK not in body[4:4 + alen]:
        return e
    attribute, payload = decode_payload(e.flag, body)
    bits = compression_bits(attribute)
    if not bits:
        return e
    flag, data = encode_payload(inflate_body(bits, payload, max_body), without_compression(attribute))
    return e._replace(flag=(e.flag & ~1) | flag, body=data, checksum=metaq_checksum(data))
