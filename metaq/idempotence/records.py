"""An idempotent put's identity, as it travels and as it is stored (sans-IO).

A producer that wants each message stored exactly once gives every put an
identity: its producer id ``pid`` (1..2**63-1, random per producer unless the
application gives one) and a sequence number ``seq`` (0..2**63-1) that the
producer assigns in send order per ``(pid, topic, partition)``, starting at 0.
A resend of the same put (a retry after a timeout, a retried Spark task that
reuses its pid) carries the same identity, and the broker answers it with the
original's message id and offset instead of storing it again
(``metaq.idempotence.window`` keeps the window of identities it has seen).

**On the wire.**

* Text protocol (our extension, like ``put_delayed``):
  ``put_idem <topic> <partition> <len> <flag> <checksum> <pid> <seq> <opaque>\\r\\n<body>``; the partition
  must be explicit (0..2^31-1). The reply is a put's, ``result 200 <len> <opaque>`` with body
  ``<msgId> <partition> <offset>``; a duplicate's body has a fourth token, ``dup``, and names the
  original (``idempotence.wire.DUPLICATE_MARK``).
* RocketMQ remoting (SEND_MESSAGE, V2): the message properties ``METAQ_PID`` and ``METAQ_SEQ`` (decimal);
  the queue id must be explicit; a duplicate is answered SUCCESS with the original's offset message id and
  queue offset. A batch, a delay or a transactional (half) message cannot carry them.

**In the record.** The identity is stored in the record itself, so the
broker's window is a function of the log alone: rebuilt from it after a crash,
identical on a slave that copied the log. The broker appends the two properties
to the attribute, after the ``\\x02`` of the RocketMQ mapping
(``metaq.protocol.rocketmq.mapping``: ``attribute = TAGS "\\x02" key "\\x01" value "\\x02" ...``)::

    put_idem with attribute "color=red", pid 7, seq 0
      -> stored attribute "color=red\\x02METAQ_PID\\x017\\x02METAQ_SEQ\\x010\\x02"
    put_idem without an attribute (flag bit 0 clear)
      -> flag bit 0 set, stored attribute "\\x02METAQ_PID\\x017\\x02METAQ_SEQ\\x010\\x02"

and computes the new checksum. The metaq client (``Message.from_record``) shows
the part before the ``\\x02`` as ``attribute`` (None when it is empty) and the
two properties in ``properties``; a RocketMQ consumer sees them as properties;
the Spark reader's ``attribute`` column shows the part before the ``\\x02``. A
plain MetaQ client (Java's) reading with ``get`` sees the whole attribute
string, separators included. A user attribute of ``""`` comes back as None.
A text put's MetaQ flag is kept as the ``@FLAG`` internal property (when not
0), so a RocketMQ consumer sees the flag it saw before (``mapping.message_of_record``).

**Its owner.** With authentication on, the broker also appends the user who sent the put, after the
identity: ``...\x02METAQ_SEQ\x010\x02METAQ_OWNER\x01alice\x02``. The producers' table keeps each user's
windows within that user's quota (``metaq.idempotence.window``), and a table rebuilt from the log (a slave's,
a recovery's) must know whose each window is. A record written without it (authentication off, or by a broker
from before quotas) has no owner (``stored_identity`` gives None). A put's own attribute cannot carry
``METAQ_OWNER`` (``with_identity`` refuses it), so a client cannot name another user as the owner.

The property names are reserved: a plain put (text or remoting, local
transaction, delayed) whose attribute carries them is refused (``has_identity``),
so no record outside this path can look like an idempotent one.
"""

import struct

from metaq.errors import ClientError
from metaq.protocol.message import ATTRIBUTE_FLAG, decode_payload
from metaq.protocol.properties import (PID_MARK, PID_PROPERTY, PROPERTY_SEPARATOR, SEQ_MARK, SEQ_PROPERTY, has_identity,
                                       decode_properties)

__all__ = ["PID_PROPERTY", "SEQ_PROPERTY", "OWNER_PROPERTY", "MARK", "SEQ_MARK", "OWNER_MARK", "MAX_PID", "MAX_SEQ",
           "check_identity", "with_identity", "identity_in_attribute", "stored_identity", "has_identity",
           "owner_suffix"]

OWNER_PROPERTY = "METAQ_OWNER"
#: A put's own attribute must not hold it (the broker writes the owner).
OWNER_MARK = ("\x02%s\x01" % OWNER_PROPERTY).encode("ascii")
#: The bytes every stored idempotent record's attribute holds (found with one bytes search before decoding); the
#: identity's property names and marks are the protocol's (``protocol.properties``: reserved, ``protocol.burst``).
MARK = PID_MARK
_SEP = PROPERTY_SEPARATOR.encode("ascii")
_ATTR_LEN = struct.Struct(">i")
_COPY_BELOW = 64 * 1024
MAX_PID = 2**63 - 1
MAX_SEQ = 2**63 - 1


def check_identity(pid, seq):
    """``(pid, seq)`` as ints, or ClientError naming the one out of range."""
    if type(pid) is not int or not 1 <= pid <= MAX_PID:
        raise ClientError("invalid producer id %r: must be 1..%d" % (pid, MAX_PID))
    if type(seq) is not int or not 0 <= seq <= MAX_SEQ:
        raise ClientError("invalid sequence %r: must be 0..%d" % (seq, MAX_SEQ))
    return pid, seq


def owner_suffix(owner):
    """The bytes the identity ends with for ``owner`` (a user name, or None: none)."""
    return b"" if owner is None else b"METAQ_OWNER\x01" + owner.encode("utf-8") + _SEP


def with_identity(flag, data, pid, seq, owner=None):
    """``(flag, data)`` of the stored record: the put's data with the identity (and ``owner``, the user who sent
    it, when not None) appended to its attribute.

    Works on the bytes (one copy of the payload). ClientError when the attribute block is malformed or already
    carries the reserved properties.
    """
    ident = b"METAQ_PID\x01%d\x02METAQ_SEQ\x01%d\x02" % (pid, seq) + owner_suffix(owner)
    if flag & ATTRIBUTE_FLAG:
        if len(data) < 4:
            decode_payload(flag, data)  # raises the reason
        (alen,) = _ATTR_LEN.unpack_from(data, 0)
        end = 4 + alen
        if alen < 0 or end > len(data):
            decode_payload(flag, data)
        attr = data[4:end]
        if MARK in attr or SEQ_MARK in attr or OWNER_MARK in attr:
            raise ClientError("the attribute already carries %s/%s/%s: these properties are set by the broker"
                              % (PID_PROPERTY, SEQ_PROPERTY, OWNER_PROPERTY))
        if _SEP not in attr:
            ident = _SEP + _flag_prop(flag) + ident
        elif not attr.endswith(_SEP):
            ident = _SEP + ident
    else:
        attr, end = b"", 0
        ident = _SEP + _flag_prop(flag) + ident
    payload = data[end:] if len(data) < _COPY_BELOW else memoryview(data)[end:]  # a big one is copied once only
    return flag | ATTRIBUTE_FLAG, b"".join((_ATTR_LEN.pack(len(attr) + len(ident)), attr, ident, payload))


def _flag_prop(flag):
    """A text put's MetaQ flag, kept for RocketMQ consumers (``mapping.message_of_record`` reads ``@FLAG``)."""
    return b"@FLAG\x01%d\x02" % flag if flag else b""


def identity_in_attribute(attribute):
    """``(pid, seq)`` stored in an attribute string, or None (no identity, or a malformed one)."""
    found = stored_identity(attribute)
    return None if found is None else found[:2]


def stored_identity(attribute):
    """``(pid, seq, owner)`` stored in an attribute string (owner None: a record without one), or None (no
    identity, or a malformed one)."""
    if attribute is None:
        return None
    _tags, sep, rest = attribute.partition(PROPERTY_SEPARATOR)
    if not sep:
        return None
    props = decode_properties(rest)
    try:
        pid, seq = int(props[PID_PROPERTY]), int(props[SEQ_PROPERTY])
    except (KeyError, ValueError):
        return None
    if not 1 <= pid <= MAX_PID or not 0 <= seq <= MAX_SEQ:
        return None
    return pid, seq, props.get(OWNER_PROPERTY)
