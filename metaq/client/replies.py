"""The client's one map from a broker's ``result <code>`` reply to an error (docs/text-protocol.md).

    400 ClientError     the request was wrong (bad topic, partition, body...)
    401 Unauthenticated no user proved itself on this connection, or the proof was wrong
    403 Forbidden       the user may not do this (the topic, group or admin operation is not theirs)
    404 NotFound        nothing there
    500 BrokerError     the broker failed
    503 Unavailable     try again later (a slave, a failed flush, too many connections...); a text
                        ``NOT_MASTER: ...`` is ``errors.NotMaster``, its ``master`` the URL it names
    504 NoReply         a ``request`` got no reply within its timeout (docs/messaging.md "Request-reply")
    507 DiskFull        the broker's disk is full (or above its danger mark): writes are refused
                        until space returns (``errors.DiskFull``; a kind of Unavailable)
    412 Diverged        a get's ``expect`` failed: the broker's record at that offset is not the one
                        the client read before (its log diverged there after a failover)
    512 CorruptRecord   a get reached a stored record that fails its CRC check; the broker never
                        serves it. The error carries topic, partition, offset and next_offset
                        (``errors.CorruptRecord``; the consumer's ``skip_corrupt`` goes past it)

Any other code becomes a ``BrokerError`` whose ``code`` is the code the broker sent. A reply
that is not a ``result`` at all (a ``value`` where a result was expected) is a BrokerError.
"""

from metaq import errors
from metaq.protocol import events as ev

__all__ = ["REPLY_ERRORS", "reply_error"]

#: ``result`` code -> the error class it stands for.
REPLY_ERRORS = {
    400: errors.ClientError,
    errors.Unauthenticated.code: errors.Unauthenticated,
    errors.Forbidden.code: errors.Forbidden,
    404: errors.NotFound,
    500: errors.BrokerError,
    503: errors.Unavailable,
    errors.DiskFull.code: errors.DiskFull,
    errors.NoReply.code: errors.NoReply,
    errors.GroupActive.code: errors.GroupActive,
    errors.Diverged.code: errors.Diverged,
}


def reply_error(reply, what=None):
    """The error a non-200 reply stands for.

    Its message is the broker's text; with ``what`` (say ``"stats offsets"``) it reads
    ``"<what>: result <code> <text>"``.
    """
    if not isinstance(reply, ev.Result):
        reason, code = "unexpected reply", 500
    else:
        reason, code = bytes(reply.body).decode("utf-8", "replace"), reply.code
    if code == errors.CorruptRecord.code:
        corrupt = errors.parse_corrupt_record(reason)
        if corrupt is not None:
            return corrupt
    if code == errors.NotMaster.code:
        not_master = errors.parse_not_master(reason)
        if not_master is not None:
            if what is not None:
                not_master.args = ("%s: result %d %s" % (what, code, reason),)
            return not_master
    cls = REPLY_ERRORS.get(code)
    if what is not None:
        reason = "%s: result %d %s" % (what, code, reason)
    elif cls is None:
        reason = "answered %s: %s" % (code, reason)
    error = (cls or errors.BrokerError)(reason)
    if cls is None:
        error.code = code
    return error
