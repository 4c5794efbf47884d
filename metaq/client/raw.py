"""Raw blocking clients over the sans-IO codecs, one request at a time: for operators' scripts, benchmarks, tests.

``TextClient`` speaks the MetaQ text protocol (``metaq.protocol.text``), ``RemotingClient`` RocketMQ's
remoting frames (``metaq.protocol.rocketmq.remoting``). Unlike ``metaq.client.connection`` they do not pipeline,
retry or reconnect: what is sent is exactly what the caller asked for, which is what a probe or a
protocol test needs.
"""

import itertools
import socket
import time

from metaq.auth import proofs
from metaq.protocol import stats as stats_codec
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload, iter_records
from metaq.priorities.wire import PriorityGet, PriorityPut, decode_get_prio_body
from metaq.protocol.rocketmq.remoting import RemotingParser, encode_command, ext_str, make_request
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.protocol.text import TextParser, serialize
from metaq import textcommands  # noqa: F401 - every text command declared (the whole table)

__all__ = ["TextClient", "RemotingClient", "pull_fields", "PULL_FLAGS"]

#: SUSPEND | SUBSCRIPTION, as the official C++ client's first pull.
PULL_FLAGS = 2 | 4


def _connect(host, port, timeout, ssl_context=None, server_hostname=None, source=None):
    sock = socket.create_connection((host, port), timeout=timeout,
                                    source_address=None if source is None else (source, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if ssl_context is not None:
        sock = ssl_context.wrap_socket(sock, server_hostname=server_hostname or host)
    return sock


class _Blocking:
    """A raw client's socket: closed by ``close()`` or on leaving a ``with`` block."""

    sock = None

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class TextClient(_Blocking):
    """A raw-socket client that speaks the text protocol through our sans-IO parser, one request at a time.

    ``put_ok`` and ``stats`` raise AssertionError on any reply but 200 (they are for scripts that must stop there).
    """

    def __init__(self, host, port, timeout=10.0, ssl_context=None, server_hostname=None, source=None):
        """``source``: the local address to connect from (a probe of per-address rules), else the system's."""
        self.sock = _connect(host, port, timeout, ssl_context, server_hostname, source)
        self.parser = TextParser(max_body=64 << 20)
        self._opaque = itertools.count(1)

    def opaque(self):
        return next(self._opaque)

    def send(self, data):
        self.sock.sendall(data)

    def read_event(self):
        """The next reply (Result or Value), or CLOSED when the broker closed the connection."""
        while True:
            event = self.parser.next_event()
            if event is not NEED_DATA:
                return event
            data = self.sock.recv(1 << 20)
            self.parser.receive_data(data)

    def call(self, event):
        self.send(serialize(event))
        return self.read_event()

    def put(self, topic, payload, partition=-1, attribute=None, checksum=True):
        flag, data = encode_payload(payload, attribute)
        crc = metaq_checksum(data) if checksum else -1
        return self.call(ev.Put(topic, partition, flag, data, self.opaque(), crc))

    def put_ok(self, topic, payload, partition=-1, attribute=None):
        """Put and return (msg_id, partition, offset); fail the test on anything but 200."""
        r = self.put(topic, payload, partition, attribute)
        if not (isinstance(r, ev.Result) and r.code == 200):
            raise AssertionError(r)
        msg_id, part, offset = (int(x) for x in r.body.split())
        return msg_id, part, offset

    def get(self, topic, partition, offset, max_size=1 << 20, group="g", max_wait_ms=None, expect=None):
        """``expect``: ``(offset, msg_id)`` of the record read last (events.Get): a 412 when this log differs."""
        return self.call(ev.Get(topic, group, partition, offset, max_size, self.opaque(), max_wait_ms, expect))

    def get_tags(self, topic, partition, offset, tags, max_size=1 << 20, group="g", max_wait_ms=None):
        """``get_tags`` (docs/messaging.md "Tag filtering"): the reply; ``decode_tagged_body(reply.body)`` reads a
        Value's."""
        return self.call(ev.GetTags(topic, group, partition, offset, max_size, tags, self.opaque(), max_wait_ms))

    def get_sql(self, topic, partition, offset, expression, max_size=1 << 20, group="g", max_wait_ms=None):
        """``get_sql`` (docs/messaging.md "SQL92 filters"): the reply, as ``get_tags``'s (``decode_tagged_body``)."""
        return self.call(ev.GetSql(topic, group, partition, offset, max_size, expression, self.opaque(), max_wait_ms))

    def put_prio(self, topic, payload, priority, partition=-1, attribute=None):
        """``put_prio`` (docs/messaging.md "Priorities"): the reply, as a put's."""
        flag, data = encode_payload(payload, attribute)
        return self.call(PriorityPut(topic, partition, flag, data, self.opaque(), metaq_checksum(data), priority))

    def get_prio(self, topic, partition, offsets, max_size=1 << 20, group="g", max_wait_ms=None, expects=None):
        """``get_prio`` with one offset per level (``expects``: one ``(offset, msg_id)`` or None per level):
        ``(level, [Record])`` for a Value, else the reply (404, 301, 412 ...)."""
        r = self.call(PriorityGet(topic, group, partition, tuple(offsets), max_size, self.opaque(), max_wait_ms,
                                  None if expects is None else tuple(None if x is None else tuple(x)
                                                                     for x in expects)))
        if not isinstance(r, ev.Value):
            return r
        level, records = decode_get_prio_body(r.body)
        return level, [rec for rec, _end in iter_records(records)]

    def get_records(self, topic, partition, offset, max_size=1 << 20):
        r = self.get(topic, partition, offset, max_size)
        if not isinstance(r, ev.Value):
            return r
        return [rec for rec, _end in iter_records(r.body)]

    def offset_at(self, topic, partition, timestamp_ms):
        """``offset_at``'s reply: a Result whose body is the first offset stored at or after ``timestamp_ms`` (ms
        since the Unix epoch), or the broker's refusal."""
        return self.call(ev.OffsetAt(topic, partition, timestamp_ms, self.opaque()))

    def auth(self, user, secret):
        """The ``auth`` handshake (docs/security.md): the final Result (200: authenticated, and the broker's
        proof was checked; else the broker's refusal, after which it closes the connection)."""
        r = self.call(ev.Auth(user, None, None, self.opaque()))
        if not (isinstance(r, ev.Result) and r.code == 200):
            return r
        nonce, client_nonce = r.body.decode("ascii"), proofs.new_nonce()
        secret = secret.encode("utf-8") if isinstance(secret, str) else secret
        r = self.call(ev.Auth(user, client_nonce, proofs.text_proof(secret, "client", user, nonce, client_nonce),
                              self.opaque()))
        if isinstance(r, ev.Result) and r.code == 200 and not proofs.same(
                r.body, proofs.text_proof(secret, "server", user, nonce, client_nonce)):
            raise AssertionError("the broker's proof is wrong: it does not hold %s's secret" % user)
        return r

    def stats(self, item=None):
        r = self.call(ev.Stats(item, self.opaque()))
        if r.code != 200:
            raise AssertionError(r)
        return r.body.decode()

    def stats_dict(self, item=None):
        """``{key: value}`` of any ``stats`` item (metaq.protocol.stats: each line split at its first space)."""
        return stats_codec.parse_summary(self.stats(item).encode())


class RemotingClient(_Blocking):
    """A raw remoting connection: requests out through ``encode_command``, frames in through ``RemotingParser``."""

    def __init__(self, port, timeout=10.0, credentials=None, ssl_context=None, server_hostname=None):
        """``credentials``: ``(access key, secret key)``: every request is signed as RocketMQ's ACL client hook
        signs it (``AccessKey`` and ``Signature`` extFields)."""
        self.sock = _connect("127.0.0.1", port, timeout, ssl_context, server_hostname)
        self.credentials = credentials
        self.parser = RemotingParser(max_frame=64 << 20)
        self._opaques = itertools.count(1)
        self.pending = []  # commands read while waiting for another opaque

    def send_raw(self, data):
        self.sock.sendall(data)

    def request(self, code, ext=None, body=b"", oneway=False, version=63):
        opaque = next(self._opaques)
        if self.credentials is not None:
            ext = sign_request(ext, body, *self.credentials)
        self.send_raw(encode_command(make_request(code, ext, body, opaque, oneway, "CPP", version)))
        return opaque

    def read(self, timeout=10.0):
        """The next frame from the broker, or CLOSED."""
        if self.pending:
            return self.pending.pop(0)
        self.sock.settimeout(timeout)
        while True:
            event = self.parser.next_event()
            if event is not NEED_DATA:
                return event
            try:
                data = self.sock.recv(1 << 20)
            except ConnectionResetError:
                data = b""
            self.parser.receive_data(data)

    def response(self, opaque, timeout=10.0):
        """The response to ``opaque`` (other frames are kept for later ``read`` calls)."""
        deadline = time.monotonic() + timeout
        kept = []
        try:
            while True:
                cmd = self.read(max(0.01, deadline - time.monotonic()))
                if cmd is CLOSED or (cmd.is_response and cmd.opaque == opaque):
                    return cmd
                kept.append(cmd)
        finally:
            self.pending.extend(kept)

    def call(self, code, ext=None, body=b"", version=63, timeout=10.0):
        return self.response(self.request(code, ext, body, version=version), timeout)

    def is_closed(self, timeout=5.0):
        """True once the broker has closed the connection (nothing else may arrive first)."""
        return self.read(timeout) is CLOSED


def sign_request(ext, body, access_key, secret_key):
    """``ext`` (values as they will go on the wire) with RocketMQ's ``AccessKey`` and ``Signature`` added."""
    fields = {k: v for k, v in ((k, ext_str(v)) for k, v in (ext or {}).items()) if v is not None}
    fields["AccessKey"] = access_key
    secret = secret_key.encode("utf-8") if isinstance(secret_key, str) else secret_key
    fields["Signature"] = proofs.rocketmq_signature(secret, fields, body)
    return fields


def pull_fields(topic, queue, offset, group="CG", max_nums=32, sys_flag=PULL_FLAGS, suspend_ms=0, sub="*",
                commit_offset=-1, expression="TAG"):
    """The ext fields of a PULL_MESSAGE request."""
    return {"consumerGroup": group, "topic": topic, "queueId": queue, "queueOffset": offset, "maxMsgNums": max_nums,
            "sysFlag": sys_flag, "commitOffset": commit_offset, "suspendTimeoutMillis": suspend_ms,
            "subscription": sub, "subVersion": 0, "expressionType": expression}
