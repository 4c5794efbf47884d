"""The NATS JetStream peer's wire code (bench/nats_jetstream.py), fed bytes by a fake socket: no server, no network."""

import json

import pytest

from bench.nats_jetstream import NatsReplies, handshake, pub, pub_acked


class FakeSocket:
    """Hands out ``data`` ``chunk`` bytes per ``recv_into``/``recv``; records what is sent."""

    def __init__(self, data, chunk=1 << 20):
        self.data = data
        self.pos = 0
        self.chunk = chunk
        self.sent = b""

    def recv_into(self, view):
        n = min(self.chunk, len(view), len(self.data) - self.pos)
        view[:n] = self.data[self.pos:self.pos + n]
        self.pos += n
        return n

    def recv(self, size):
        n = min(self.chunk, size, len(self.data) - self.pos)
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def sendall(self, data):
        self.sent += data


ACK1 = b'{"stream":"BENCH", "seq":1}'
ACK2 = b'{"stream":"BENCH", "seq":2}'
PULLED = b"p" * 100
#: What a publisher and a pull consumer get: acks (nats-server 2.9 leaves two spaces where a reply
#: subject would be), a server PING and INFO update between them, a pulled message with its ack subject.
STREAM = (b"MSG _INBOX.a.ack 1  27\r\n" + ACK1 + b"\r\n"
          + b"PING\r\n"
          + b'INFO {"server_id":"x"}\r\n'
          + b"MSG _INBOX.a.ack 1 27\r\n" + ACK2 + b"\r\n"
          + b"MSG bench 1 $JS.ACK.BENCH.reader.1.1.1.1700000000.0 100\r\n" + PULLED + b"\r\n"
          + b"PONG\r\n")


def drain(replies):
    count = 0
    while replies.sock.pos < len(replies.sock.data):
        count += replies.receive()
    return count


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 26, 27, 28, 64, len(STREAM)])
def test_deliveries_are_counted_whole_however_the_bytes_arrive(chunk):
    sock = FakeSocket(STREAM, chunk)
    replies = NatsReplies(sock, keep=True)
    assert drain(replies) == 3
    assert replies.payloads == [ACK1, ACK2, PULLED]
    assert replies.nbytes == len(ACK1) + len(ACK2) + len(PULLED)
    assert sock.sent == b"PONG\r\n"  # the server's PING answered, once
    assert replies.pongs == 1
    assert replies.start == replies.end  # nothing left half-read


def test_a_delivery_is_not_counted_before_its_last_byte():
    whole = b"MSG _INBOX.a.ack 1  27\r\n" + ACK1 + b"\r\n"
    replies = NatsReplies(FakeSocket(whole[:-1]))
    assert drain(replies) == 0
    replies.sock.data, replies.sock.pos = whole[-1:], 0
    assert replies.receive() == 1


@pytest.mark.parametrize("data, message", [
    (b'MSG _INBOX.a.ack 1  60\r\n{"error":{"code":503,"description":"jetstream not enabled"}}\r\n',
     "jetstream not enabled"),
    (b"-ERR 'Maximum Payload Violation'\r\n", "Maximum Payload Violation"),
    (b"HMSG _INBOX.a.ack 1 16 16\r\nNATS/1.0 503\r\n\r\n\r\n", "NATS/1.0 503"),
    (b"HMSG _INBOX.a.pull 1  28 28\r\nNATS/1.0 404 No Messages\r\n\r\n\r\n", "404 No Messages"),
    (b"+OK\r\nHELLO there\r\n", "HELLO there"),
])
def test_errors_and_the_unexpected_raise(data, message):
    replies = NatsReplies(FakeSocket(data))
    with pytest.raises(RuntimeError, match=message):
        drain(replies)


def test_publish_frames():
    assert pub(b"bench", b"abc") == b"PUB bench 3\r\nabc\r\n"
    assert pub(b"bench", b"abc", b"_INBOX.x.ack") == b"PUB bench _INBOX.x.ack 3\r\nabc\r\n"
    frame = pub_acked(b"_INBOX.x")
    head, body = frame.split(b"\r\n", 1)
    assert head == b"PUB bench _INBOX.x.ack 1024"
    assert body == b"p" * 1024 + b"\r\n"


def test_handshake_sends_connect_then_subscribes_the_inbox():
    sock = FakeSocket(b'INFO {"server_id":"N1","version":"2.9.10","jetstream":true,"max_payload":1048576}\r\n', 10)
    info = handshake(sock, b"_INBOX.abc")
    assert info["version"] == "2.9.10"
    connect, sub, ping, rest = sock.sent.split(b"\r\n")
    assert connect.startswith(b"CONNECT ")
    options = json.loads(connect[len(b"CONNECT "):])
    assert options["verbose"] is False and options["headers"] is True
    assert (sub, ping, rest) == (b"SUB _INBOX.abc.> 1", b"PING", b"")


def test_handshake_refuses_a_server_that_is_not_nats():
    with pytest.raises(RuntimeError, match="not a nats server"):
        handshake(FakeSocket(b"+PONG\r\n"), b"_INBOX.abc")
