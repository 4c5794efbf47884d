"""What every RPC group of RocketMQ 5's ``MessagingService`` shares about a call: whose client it is (``ClientKey``,
``client_of``), its in-band status (``status``, ``code_of``), its pacing by its user's rates (``paced_wait``), and a
stored message as a client is given it (``message_of``).

As RocketMQ's proxy does, business errors travel in-band: grpc-status 0 and the response's ``status`` holding an
``apache.rocketmq.v2.Code`` (``Refusal`` and ``code_of``), authentication failures (``UNAUTHORIZED``) included;
Telemetry's are out of band (INVALID_ARGUMENT for the 4xxxx codes, INTERNAL otherwise).
"""

import functools
import time
from typing import NamedTuple

import gevent

from metaq import errors
from metaq.rmq5 import messages_pb2 as pb
from metaq.rmq5.messagebytes import encode_fields, message_bytes
from metaq.clock import now_ms

#: What a long poll keeps of the call's deadline to answer in: the poll ends this much before the client gives up.
POLL_RESERVE_MS = 300


def paced_wait(guard, call, last, kind="fetch"):
    """Wait, in the call's own greenlet, what the call's user still owes its rate of ``kind`` (``Guard.pace``, the
    one pacing point: a receive or a pull charges the bytes of the records it answers with, a SendMessage its
    messages' bodies) before a read takes anything (a send: before it writes, and it writes after the wait anyway).
    True to read on; False when the wait would pass ``last`` (monotonic: the call's deadline less its reserve) or the
    client reset the call: the call then answers that nothing came, at ``last`` at the latest. A paced receive
    never takes messages it then holds while it waits (their invisible time starts when it takes them), and no
    call outlives its deadline."""
    if guard is None:
        return True
    owed = guard.pace(call, kind, 0)
    if owed <= 0:
        return True
    left = last - time.monotonic()
    cancel = getattr(call, "cancelled", None)
    if left > 0:
        if cancel is not None:
            cancel.wait(min(owed, left))
        else:
            gevent.sleep(min(owed, left))
    return owed <= left and not (cancel is not None and cancel.is_set())


def status(code, message=None):
    """An ``apache.rocketmq.v2.Status`` with ``code`` (a Code name) and a message (the code's name by default, as
    the proxy always fills it)."""
    return pb.Status(code=_CODES[code], message=message or code)


def status_fields(code, message=None):
    """``status(code, message)``'s fields, as ``messagebytes.encode_fields`` writes them (a response written as its
    bytes)."""
    return (1, _CODES[code], 2, message or code)


_CODES = {name: value for name, value in pb.Code.items()}


def code_of(exc):
    """The in-band Code name of a metaq error raised by the put path or the store."""
    if isinstance(exc, errors.Unauthenticated):
        return "UNAUTHORIZED"
    if isinstance(exc, errors.QuotaExceeded):
        return "TOO_MANY_REQUESTS"
    if isinstance(exc, errors.Forbidden):
        return "FORBIDDEN"
    if isinstance(exc, errors.UnknownTopic):
        return "TOPIC_NOT_FOUND"
    if isinstance(exc, errors.InvalidTopic):
        return "ILLEGAL_TOPIC"
    if isinstance(exc, errors.BadCompressedBody):
        return "MESSAGE_CORRUPTED"
    if isinstance(exc, errors.ClientError):
        return "BAD_REQUEST"
    if isinstance(exc, errors.Unavailable):
        return "HA_NOT_AVAILABLE" if isinstance(exc, errors.NotMaster) else "INTERNAL_SERVER_ERROR"
    return "INTERNAL_SERVER_ERROR"


class ClientKey(NamedTuple):
    """Whose client a call is: the ``user`` it signed in as ("" with authentication off) and its ``x-mq-client-id``
    (``id``). Every per-client map of the port is keyed by it (see ``client_of``)."""

    user: str
    id: str

    def __str__(self):
        return "%s/%s" % (self.user, self.id) if self.user else self.id


#: ``ClientKey`` made from a tuple of its fields without namedtuple's ``__new__`` (a Python frame a call).
_client_key = functools.partial(tuple.__new__, ClientKey)


def client_of(call):
    """Which client ``call`` is: the one decision every per-client map of the port (consumers' Settings, producers'
    streams, the renewer's clients, the admin's client streams) keys its entries by. A client id is whatever the
    caller sets, so with authentication on it is the signed-in user's: one user naming another's client id names a
    client of its own, never reads, replaces or ends the other's. Read after the call's login (``call.user``)."""
    return _client_key((getattr(call, "user", "") or "", call.metadata.get("x-mq-client-id") or ""))


def message_of(msg, endpoint, max_transfer, msg_id, into=None):
    """A stored message (``mapping.message_of_record``'s) as a ``Message`` object, as the proxy's converter fills
    it (``messagebytes.message_fields`` decides what it holds; the served paths send those bytes as they are).
    ``msg_id``: the record's metaq id, its message id when the client gave none. ``into``: an empty ``Message``
    to fill in place, returned."""
    m = pb.Message() if into is None else into
    m.MergeFromString(message_bytes(msg, endpoint, max_transfer, msg_id))
    return m


def ms_of(ts):
    """A protobuf Timestamp in milliseconds."""
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def duration_ms(d):
    """A protobuf Duration in milliseconds."""
    return d.seconds * 1000 + d.nanos // 1_000_000


def delivered_now():
    """A receive stream's last response, as its bytes: the time it was answered (its ``delivery_timestamp``, a
    Timestamp of the broker's clock in milliseconds, as protobuf writes it: no field of a zero)."""
    ms = now_ms()
    return encode_fields((3, (1, ms // 1000 or None, 2, ms % 1000 * 1_000_000 or None)))
