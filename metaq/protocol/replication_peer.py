"""The replication stream's two frames of MQTT cluster calls (types 20 and 21, ``metaq.protocol.replication``): one
master of an MQTT cluster asking another (``metaq.mqttcluster.clientids.calls``). Sans-IO.

A caller connects to the replication port as a slave does, proves the replication secret as peers do (CHALLENGE,
PROOF), then sends PEER_CALL where a slave sends HELLO; the callee answers its PROOF, then one PEER_REPLY per
PEER_CALL on the link::

    PEER_CALL   >i   broker_id int32 (the calling master's), then the request as UTF-8 JSON
    PEER_REPLY       the answer, UTF-8 JSON

Each body holds at most ``limits.MQTT_CLUSTER_MAX_CALL_BYTES``; a longer one is a fatal ``RemoteProtocolError``.
"""

import struct
from typing import NamedTuple

from metaq import limits
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.errors import RemoteProtocolError

__all__ = ["PeerCall", "PeerReply", "call_parts", "reply_parts", "check_call_length", "check_reply_length",
           "decode_call", "decode_reply"]

#: broker id of the caller.
PEER_CALL_HEAD = struct.Struct(">i")


class PeerCall(NamedTuple):
    """A request of broker ``broker_id`` (its master) to another member of the cluster: ``body`` UTF-8 JSON."""

    broker_id: int
    body: bytes


class PeerReply(NamedTuple):
    """The answer to a ``PeerCall``: ``body`` UTF-8 JSON."""

    body: bytes


def _fail(reason):
    return RemoteProtocolError(reason, fatal=True)


def _check_body(body):
    if len(body) > mqttcluster_limits.MQTT_CLUSTER_MAX_CALL_BYTES:
        raise ValueError("a peer call or reply of %d bytes is past the limit of %d (MQTT_CLUSTER_MAX_CALL_BYTES)"
                         % (len(body), mqttcluster_limits.MQTT_CLUSTER_MAX_CALL_BYTES))


def call_parts(event):
    _check_body(event.body)
    return [PEER_CALL_HEAD.pack(event.broker_id), bytes(event.body)]


def reply_parts(event):
    _check_body(event.body)
    return [bytes(event.body)]


def _check_length(length, head):
    if not head <= length <= head + mqttcluster_limits.MQTT_CLUSTER_MAX_CALL_BYTES:
        raise _fail("peer frame of %d bytes: must be %d..%d (limit MQTT_CLUSTER_MAX_CALL_BYTES)"
                    % (length, head, head + mqttcluster_limits.MQTT_CLUSTER_MAX_CALL_BYTES))


def check_call_length(length):
    _check_length(length, PEER_CALL_HEAD.size)


def check_reply_length(length):
    _check_length(length, 0)


def decode_call(payload):
    (broker_id,) = PEER_CALL_HEAD.unpack_from(payload)
    if not 0 <= broker_id <= limits.MAX_BROKER_ID:
        raise _fail("bad PEER_CALL: broker id %d" % broker_id)
    return PeerCall(broker_id, bytes(payload[PEER_CALL_HEAD.size:]))


def decode_reply(payload):
    return PeerReply(bytes(payload))
