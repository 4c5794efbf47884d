"""Request-reply on the remoting port (RocketMQ's RIP-16; docs/messaging.md "Request-reply"): SEND_REPLY_MESSAGE (324)
and SEND_REPLY_MESSAGE_V2 (325) from a replier, PUSH_REPLY_MESSAGE_TO_CLIENT (326) to a requester.

A reply is routed by ``metaq.reqreply.service.ReplyRouter``: to a text-protocol requester waiting on this broker,
or to the RocketMQ client its ``REPLY_TO_CLIENT`` names, found by its producer heartbeats
(``ProducerRegistry.client``) and pushed on the connection they came over. The replier is answered SUCCESS
(``msgId`` "0", ``queueOffset`` 0, as RocketMQ does) once the reply is handed over, SYSTEM_ERROR with RocketMQ's
remark ("push reply message fail, channel of <client> not found") when no requester waits. Replies are not
stored (RocketMQ also stores them in ``<cluster>_REPLY_TOPIC`` by default): a reply nobody waits for is
answered and dropped at once.
"""

from metaq import errors
from metaq.protocol.compression import COMPRESSION_BITS
from metaq.reqreply.records import PUSH_REPLY_TIME
from metaq.protocol.rocketmq.bodies import decode_properties, encode_properties
from metaq.protocol.rocketmq.headers import decode_send_header, push_reply_fields, send_response_fields
from metaq.protocol.rocketmq.mapping import RecordFields, message_of_record, record_data_from_send
from metaq.protocol.rocketmq.remoting import RequestCode, ResponseCode, response_for
from metaq.clock import now_ms
from metaq.loop.inflate import inflate_body
from metaq.reqreply.service import ReplyMessage


class RemotingReplies:
    """``host()``: our ``(ip, port)`` as routes give it; ``producers``: the port's ProducerRegistry (whose
    connections a reply is pushed to); ``router``: the ReplyRouter."""

    def __init__(self, host, producers, router, max_body):
        self.host = host
        self.producers = producers
        self.router = router
        self.max_body = max_body
        router.remote = self.push

    def send_reply(self, cmd, conn):
        """SEND_REPLY_MESSAGE / _V2: route the reply; SUCCESS once handed over, SYSTEM_ERROR when nobody waits."""
        h = decode_send_header(cmd)
        props = decode_properties(h.properties)
        body = inflate_body(h.sys_flag, cmd.body, self.max_body)
        flag, data = record_data_from_send(body, props, h.flag, h.sys_flag & ~COMPRESSION_BITS, h.reconsume_times,
                                           conn.peer)
        if len(data) > self.max_body:
            raise errors.ClientError("reply of %d bytes exceeds limits.max_body_bytes (%d)" % (len(data),
                                                                                             self.max_body))
        try:
            self.router.route(ReplyMessage(h.topic, flag, data, props, conn.born_host, h.born_timestamp))
        except errors.NotFound as exc:
            return response_for(cmd, ResponseCode.SYSTEM_ERROR, str(exc))
        fields = send_response_fields("0", max(h.queue_id, 0), 0)
        fields["MSG_REGION"] = "DefaultRegion"
        fields["TRACE_ON"] = "false"
        return response_for(cmd, ResponseCode.SUCCESS, None, fields)

    def push(self, client_id, reply):
        """PUSH_REPLY_MESSAGE_TO_CLIENT to ``client_id``'s connection: False when no such producer is connected,
        Unavailable when its queue of our requests is full (``limits.MAX_PENDING_NOTIFIES``)."""
        conn = self.producers.client(client_id)
        if conn is None:
            return False
        now = now_ms()
        host = self.host()
        msg = message_of_record(RecordFields(reply.topic, 0, 0, 0, reply.flag, reply.data, reply.born_ms, now), host)
        props = dict(msg.properties)
        props[PUSH_REPLY_TIME] = str(now)
        born = reply.born_host or host
        fields = push_reply_fields(None, msg.topic, 0, msg.sys_flag, reply.born_ms, msg.flag,
                                   encode_properties(props), msg.reconsume_times, "%s:%d" % born[:2],
                                   "%s:%d" % host, now)
        if not conn.send_request(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, fields, msg.body, oneway=False):
            raise errors.Unavailable("push reply message to %s fail: its connection has too many of our requests "
                                     "waiting" % client_id)
        return True
