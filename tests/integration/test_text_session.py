"""A newcomer's telnet session and the MetaQ producer line, against a real broker process."""

import socket
import time

from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import iter_records
from metaq.protocol.stream import CLOSED


def read_until(sock, marker, timeout=5.0):
    sock.settimeout(timeout)
    data = b""
    deadline = time.monotonic() + timeout
    while marker not in data and time.monotonic() < deadline:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_raw_telnet_session(broker):
    s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    s.sendall(b"version\r\n")
    assert read_until(s, b"0.1.0") == b"result 200 5 2147483647\r\n0.1.0"

    s.sendall(b"put test 0 5 0 1\r\nhello")
    reply = read_until(s, b"0 0")
    head, body = reply.split(b"\r\n")
    assert head.startswith(b"result 200 ") and head.endswith(b" 1")
    msg_id, partition, offset = body.split()
    assert (partition, offset) == (b"0", b"0") and int(msg_id) > 0

    # a typo is answered, and the connection stays usable
    s.sendall(b"gte test g 0 0 1024 2\r\n")
    reply = read_until(s, b"gte")
    assert reply.startswith(b"result 400 ") and b"unknown command" in reply

    s.sendall(b"get test g 0 0 1024 3\r\n")
    reply = read_until(s, b"hello")
    head, record = reply.split(b"\r\n", 1)
    assert head == b"value 25 3"
    [(rec, _)] = list(iter_records(record))
    assert rec.payload == b"hello" and rec.msg_id == int(msg_id)

    s.sendall(b"get test g 0 1 1024 4\r\n")
    assert read_until(s, b"position 1") == b"result 404 36 4\r\nCould not find message at position 1"

    s.sendall(b"stats\r\n")
    stats = read_until(s, b"END\r\n")
    assert stats.split(b"\r\n")[1] == b"STATS" and b"\r\ncmd_put 1\r\n" in stats

    s.sendall(b"quit\r\n")
    assert read_until(s, b"never") == b""  # closed without a reply
    s.close()


def test_metaq_six_token_producer_line(broker):
    """MetaQ's contrib Python producer sends `put topic partition len flag opaque` with no checksum."""
    with broker.client() as c:
        c.send(b"put test 2 11 0 99\r\nhello world")
        r = c.read_event()
        assert r.code == 200 and r.opaque == 99
        msg_id, partition, offset = (int(x) for x in r.body.split())
        assert partition == 2 and offset == 0
        [rec] = c.get_records("test", 2, 0)
        assert rec.payload == b"hello world" and rec.msg_id == msg_id and rec.flag == 0


def test_checksum_is_verified_and_a_bad_one_stores_nothing(broker):
    with broker.client() as c:
        good = metaq_checksum(b"hello")
        c.send(b"put test 0 5 0 %d 1\r\nhello" % (good ^ 1))
        r = c.read_event()
        assert r.code == 400 and b"Checksum failure" in r.body
        assert c.call(ev.Offset("test", "g", 0, 99, 2)).body == b"0"  # nothing was stored
        c.send(b"put test 0 5 0 %d 3\r\nhello" % good)
        assert c.read_event().code == 200


def test_attribute_round_trip_and_malformed_attribute_refused(broker):
    with broker.client() as c:
        c.put_ok("test", b"payload", 1, attribute="tag-A")
        [rec] = c.get_records("test", 1, 0)
        assert rec.attribute == "tag-A" and rec.payload == b"payload"
        # flag bit 0 set but the attribute block says 1000 bytes: refused, nothing stored
        bad = b"\x00\x00\x03\xe8abc"
        r = c.call(ev.Put("test", 1, 1, bad, 5, metaq_checksum(bad)))
        assert r.code == 400
        assert c.call(ev.Offset("test", "g", 1, 99, 6)).body == b"1"


def test_partition_minus_one_lets_the_broker_pick(broker):
    with broker.client() as c:
        parts = {c.put_ok("test", b"x%d" % i, -1)[1] for i in range(200)}
    assert parts == {0, 1, 2, 3}


def test_bad_requests_get_clear_errors_and_the_connection_survives(broker):
    with broker.client() as c:
        cases = [
            (b"put nosuch/../x 0 1 0 1\r\nx", 400, b"illegal topic"),
            (b"put test 9 1 0 2\r\nx", 400, b"wrong partition 9"),
            (b"get test g 0 0 0 3\r\n", 400, b"invalid max size:0"),
            (b"get test g 0 abc 10 4\r\n", 400, b"abc"),
            (b"offset test g 0 5\r\n", 400, b"offset"),
            (b"value 3 6\r\nabc", 400, b"reply, not a request"),
            (b"sync test 0 1 0 5 7\r\nx", 503, b"slave"),
            (b"transaction TX:s:1 s COMMIT_ONE_PHASE 8\r\n", 500, b"XAException:code=-4"),  # no such transaction
        ]
        for request, code, words in cases:
            c.send(request)
            r = c.read_event()
            assert r.code == code and words in r.body, (request, r)
        assert c.call(ev.Version(9)).code == 200
        c.send(b"transaction TX:s:1 s END 10\r\nversion 11\r\n")  # END gets no reply
        assert c.read_event().opaque == 11
        assert c.call(ev.Offset("test", "g", 0, 0, 12)).body == b"0"  # nothing was stored


def test_unknown_topic_is_refused_when_no_pattern_matches(broker_factory, tmp_path):
    from metaq.client.local import small_config

    b = broker_factory(small_config(tmp_path / "d", topics=[{"name": "orders", "partitions": 2}]))
    with b.client() as c:
        r = c.put("payments", b"x", 0)
        assert r.code == 400 and b"payments" in r.body
        assert c.put_ok("orders", b"x", 1)[1:] == (1, 0)
        r = c.get("payments", 0, 0)
        assert r.code == 404


def test_message_ids_unique_and_increasing(broker):
    with broker.client() as c:
        ids = [c.put_ok("test", b"m", i % 4)[0] for i in range(500)]
    assert ids == sorted(ids) and len(set(ids)) == 500
    assert all((i >> 12) & 0x3FF == 7 for i in ids)  # the broker id is in every message id


def test_closed_connection_replies_nothing_after_quit(broker):
    with broker.client() as c:
        c.send(b"version 1\r\nquit\r\nversion 2\r\n")
        assert c.read_event().opaque == 1
        assert c.read_event() is CLOSED
