"""A pipelined put load on real brokers that records every acknowledged message, and the check that each is
there afterwards with its payload (durability and replication tests)."""

import socket
import threading
import time

from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.protocol.text import TextParser, serialize
from metaq import textcommands  # noqa: F401 - every text command declared (the whole table)
from tests.harness.broker import consume_all

TOPIC_PARTS = [("t-a", p) for p in range(4)] + [("t-b", p) for p in range(4)]


class LoadProducer(threading.Thread):
    """Pipelines puts (depth 64) on its own connection and records every acknowledged one."""

    def __init__(self, port, pid, sizes=(64, 900, 20_000)):
        super().__init__(daemon=True)
        self.port, self.pid, self.sizes = port, pid, sizes
        self.acked = {}  # (topic, partition, offset) -> payload
        self.ack_order = []  # (time.time() the ack was read, (topic, partition, offset)), in the order acked
        self.error = None  # what stopped it other than the broker going away (a failed test)
        self.refused = []  # replies other than 200: none is expected

    def payload(self, seq):
        size = self.sizes[seq % len(self.sizes)]
        head = b"%d:%d:" % (self.pid, seq)
        return head + bytes([65 + seq % 26]) * max(0, size - len(head))

    def run(self):
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        except OSError as exc:
            self.error = exc
            return
        parser, seq, pending = TextParser(max_body=1 << 20), 0, {}
        try:
            while True:
                frames = []
                for _ in range(64):
                    topic, part = TOPIC_PARTS[(seq * 7 + self.pid) % len(TOPIC_PARTS)]
                    body = self.payload(seq)
                    pending[seq] = (topic, part, body)
                    frames.append(serialize(ev.Put(topic, part, 0, body, seq, metaq_checksum(body))))
                    seq += 1
                sock.sendall(b"".join(frames))
                while pending:
                    event = parser.next_event()
                    if event is NEED_DATA:
                        data = sock.recv(1 << 16)
                        parser.receive_data(data)
                        continue
                    if event is CLOSED:
                        return
                    topic, part, body = pending.pop(event.opaque)
                    if event.code == 200:
                        _mid, p, offset = (int(x) for x in event.body.split())
                        self.acked[(topic, p, offset)] = body
                        self.ack_order.append((time.time(), (topic, p, offset)))
                    else:
                        self.refused.append(event)
        except OSError:
            return  # the broker was killed (checked by the caller: the thread was alive until then)
        except Exception as exc:  # noqa: BLE001 - kept for the test to fail on
            self.error = exc
        finally:
            sock.close()


def start_load(broker, producers):
    threads = [LoadProducer(broker.port, i) for i in range(producers)]
    for t in threads:
        t.start()
    return threads


def check_running(threads):
    """Every producer is still putting and has been acknowledged: the fault will hit a real load."""
    for t in threads:
        assert t.is_alive() and t.error is None and not t.refused, (t.pid, t.error, t.refused[:3])
        assert t.acked, "producer %d had no acknowledgement before the fault" % t.pid


def collect(threads):
    for t in threads:
        t.join(10)
        assert not t.is_alive(), "producer %d did not notice the broker went away" % t.pid
        assert t.error is None and not t.refused, (t.pid, t.error, t.refused[:3])
    acked = {}
    for t in threads:
        acked.update(t.acked)
    return acked


def check_acked_present(broker, acked):
    lost = 0
    with broker.client(timeout=30) as c:
        for topic, part in TOPIC_PARTS:
            records = consume_all(c, topic, part)  # iter_records verifies every checksum
            for (t, p, offset), body in acked.items():
                if (t, p) != (topic, part):
                    continue
                if offset >= len(records):
                    lost += 1
                else:
                    assert records[offset].payload == body, (topic, part, offset)
    return lost
