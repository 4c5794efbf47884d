"""A device's plain read stored and acknowledged in one step (``plainturn.plain_turn``; compiled where built): seeded
reads hold every way out of the turn to what it must call and hand back; on a real broker, a turn the burst writer
stops short of (a segment roll, the next index file) goes on through the general path with every message stored
once, in order, and acknowledged, and a read that is not wholly plain PUBLISHes is left to the general path
(docs/mqtt.md)."""

import os
import random
import time

import pytest

from metaq.client.consumer import Consumer
from metaq.mqtt.limits import MQTT_MAX_PACKET_BYTES, MQTT_PUBLISH_BURST, MQTT_PUBLISH_BURST_BYTES
from metaq.mqtt import port, wire
from metaq.mqtt.plainturn import entries_of, plain_turn
from metaq.mqtt.records import partition_for
from metaq.mqtt.wire import Publish
from metaq.serving.putpath import ACK_NOW, PutPath
from metaq.store.results import BurstRun
from tests.harness.broker import url_of
from tests.harness.mqtt import Raw, mqtt_config
from tests.mqtt.test_plain_publishes import NAMES, PARTITIONS, _plans, _random_packet


class _World:
    """The objects a turn is given (the port and its store, the acknowledgements, the connection; the put path is a
    ``_Path`` of it), recording every call made of them in one log."""

    def __init__(self, rng, unacked, largest):
        self.log = []
        self.rng = rng
        self.unacked = unacked
        self.burst_largest = largest
        self.store = self
        self.serving = self  # (the port's waiting deliveries: ``serve``)
        self.mode = rng.choice([0, 0, 1, 2])
        self.log_cuts = rng.randrange(5)
        self.fail = rng.random() < 0.05
        self.pending = rng.choice([0, 0, 0, 1])
        self.takes = rng.choice([None, 0, 1, 2, 1 << 20, 1 << 20])  # the socket's answer: closed/TLS, full, a part, all
        self.direct_fd = -1  # (written by descriptor: tests/mqtt/test_pubacks_now.py)
        self.sent = _Event(self.log) if rng.random() < 0.3 else None  # ``wait_for_room`` waited once

    frames_of = staticmethod(port.burst_frames)

    def serve(self, *args):
        raise AssertionError("the put path calls it, not the turn")

    def queue_pubacks(self, data, wait=None):
        self.log.append(("queue_pubacks", data, wait, self.unacked))

    def queue(self, packet):
        self.log.append(("queue", packet, self.unacked))

    def try_send(self, data):
        self.log.append(("try_send", data, self.unacked))
        return self.takes if self.takes is None else min(self.takes, len(data))


class _Path(PutPath):
    """The put path a turn is given: a real ``PutPath`` (the type the compiled turn calls its methods on) whose burst
    writer, counts and wake are the world's, recorded in its log."""

    def __init__(self, world):
        self.world = world
        self.rng = world.rng
        self.log = world.log

    def burst_written(self, keys, now, quiet, deliver, args):
        self.log.append(("written", sorted(keys), now, quiet, deliver, args))
        return self.world.mode

    # the burst writer: takes a random number of the frames, one run a frame
    def append_burst(self, frames, src, now):
        self.log.append(("append", list(frames), bytes(src), now))
        if self.world.fail:
            raise OSError("the disk went away")
        took = self.rng.randrange(len(frames) + 1) if self.rng.random() < 0.3 else len(frames)
        runs = [BurstRun((f[0].decode(), f[1]), 1, f[5], 1000 + k, 50 + k, k, 4096 + 100 * k)
                for k, f in enumerate(frames[:took])]
        return took, runs

    def counted(self, topic, count, nbytes):
        self.log.append(("counted", topic, count, nbytes))


class _Event:
    def __init__(self, log):
        self.log = log

    def set(self):
        self.log.append(("sent",))


def _turn(world, data, v5, max_packet, plans, decided, room, now):
    try:
        return plain_turn(world, _Path(world), world, world, "dev-1", MQTT_PUBLISH_BURST, MQTT_PUBLISH_BURST_BYTES,
                          data, v5, max_packet, plans, decided, room, now)
    except OSError as exc:
        return ("raised", str(exc))


def _check(world, went, unacked, data, v5, max_packet, plans, decided, room, now):
    """What the turn called and handed back, against the wire's split of the read: the way out it took."""
    split, pos, qos1, nbytes, pubacks = wire.read_publishes(data, 0, v5, max_packet, plans, decided, room,
                                                            MQTT_PUBLISH_BURST, MQTT_PUBLISH_BURST_BYTES)
    entries = entries_of(split)
    log = world.log
    if went is None:
        assert not entries and not log and world.unacked == unacked
        return "none"
    assert world.unacked >= unacked + qos1 - (len(pubacks) >> 2)
    frames, src, general, _names = port.burst_frames(entries, world.burst_largest)
    if pos < len(data) or general:  # other bytes follow, or a record the burst writer does not take: no write
        assert went == (entries, qos1, nbytes, pubacks, pos, None) and not log and world.unacked == unacked + qos1
        return "rest"
    assert log[0] == ("append", frames, src, now)
    if went is not True and went[0] == "raised":
        assert len(log) == 1
        return "raised"
    took = len(frames) if went is True else went[5][2]
    runs = [BurstRun((f[0].decode(), f[1]), 1, f[5], 1000 + k, 50 + k, k, 4096 + 100 * k)
            for k, f in enumerate(frames[:took])]
    keys = {r[0] for r in runs}
    log_end = runs[-1][6] if runs else 0
    assert log[1:1 + len(runs)] == [("counted", r[0][0], r[1], r[2]) for r in runs]  # each run counted once
    rest = log[1 + len(runs):]
    if went is not True:  # the writer stopped short: the general path goes on from there, nothing acknowledged
        assert went == (entries, qos1, nbytes, pubacks, pos, (frames, src, took, log_end, keys, runs)) and not rest
        assert world.unacked == unacked + qos1
        return "taken"
    assert rest[0] == ("written", sorted(keys), now, None, world.serving.serve, (keys, entries, runs, "dev-1", now))
    acked = rest[1:]
    if not pubacks:
        assert not acked and world.unacked == unacked + qos1
    elif world.mode != ACK_NOW:  # they wait for the flush or the slaves, behind what is queued
        assert acked == [("queue_pubacks", pubacks, (keys, log_end, now, world.log_cuts), unacked + qos1)]
    elif world.pending or not world.takes:  # not now: queued as they are
        assert acked[-1] == ("queue_pubacks", pubacks, None, unacked + qos1) and world.unacked == unacked + qos1
    else:  # written now, counted as they went; a part's rest finished by the writer
        n = len(pubacks) >> 2
        assert acked[0] == ("try_send", pubacks, unacked + qos1) and world.unacked == unacked + qos1 - n
        assert acked[1:] == ([("queue", b"", unacked + qos1 - n)] if world.takes < len(pubacks) else []) + (
            [("sent",)] if world.sent is not None else [])
    return "done"


@pytest.mark.parametrize("v5", [False, True], ids=["v311", "v5"])
def test_each_way_out_of_the_turn_makes_the_calls_it_must_and_hands_back_the_rest(v5):
    """Seeded reads (plain PUBLISHes most often, odd ones and other packets among them, cut short sometimes), the burst
    writer taking all or some of them or failing, records too large for it, each mode of the put path, each answer
    of the socket: the turn stores what it takes once, counts each run, makes it visible with the delivery, and
    writes, queues or hands back the PUBACKs as the mode and the socket say; what it does not end it hands back
    whole."""
    rng = random.Random(5957 + v5)
    plans = _plans()
    kinds, sends = set(), set()
    for k in range(800):
        if rng.random() < 0.5:  # a device's common read: plain QoS 1 PUBLISHes of names staged before
            data = b"".join(wire.encode(Publish(rng.choice(NAMES), rng.randbytes(rng.randrange(200)), 1, False, False,
                                                rng.randrange(1, 65536)), wire.MQTT_5 if v5 else wire.MQTT_311)
                            for _ in range(rng.randrange(1, 4)))
        else:
            data = b"".join(_random_packet(rng, v5) for _ in range(rng.randrange(1, 6)))
        if rng.random() < 0.2:
            data = data[:rng.randrange(1, len(data) + 1)]
        decided = {t: n for t, n in PARTITIONS.items() if rng.random() < 0.9}
        args = (data, v5, rng.choice([MQTT_MAX_PACKET_BYTES, 150]), plans, decided, rng.randrange(0, 6),
                1_700_000_000_000 + k)
        unacked = rng.randrange(3)
        world = _World(random.Random(rng.random()), unacked, rng.choice([1 << 20, 1 << 20, 100]))
        went = _turn(world, *args)
        kinds.add(_check(world, went, unacked, *args))
        if any(call[0] == "try_send" for call in world.log):
            sends.add(world.takes)
    assert kinds == {"none", "done", "rest", "taken", "raised"}  # every way out was met
    assert sends == {None, 0, 1, 2, 1 << 20}  # and every answer of the socket to the PUBACKs


# -- on a real broker --------------------------------------------------------------------------------------------------

BROKER_PARTITIONS = 2  # small_config's "*" topics


@pytest.fixture(scope="module", params=["sync", "async"])
def mqtt_broker(tmp_path_factory, request):
    """A broker with each flush: ``sync`` (the turn's PUBACKs wait for the flush: ``acks.pubacks``) and ``async`` (they
    go at once from the turn, ``conn.try_send``)."""
    from metaq.client.local import BrokerProcess
    wd = tmp_path_factory.mktemp("mqtt-plain-turn")
    config = mqtt_config(wd)
    # the smallest segments, short index files
    config["store"].update(segment_size=64 << 10, index_file_units=16, flush=request.param)
    config["limits"]["max_body_bytes"] = 32 << 10
    b = BrokerProcess(wd, config).start()
    yield b
    b.kill()


def _stored(b, name, count):
    """The bodies of MQTT topic ``name``'s messages in the order of the log, once ``count`` are there (or 10 s on)."""
    topic = name.split("/", 1)[0]
    partition = "%d-%d" % (b.config["broker"]["id"], partition_for(name, BROKER_PARTITIONS))
    deadline = time.monotonic() + 10
    got, offset = [], 0
    with Consumer("g", brokers=[url_of(b)]) as consumer:
        while len(got) < count and time.monotonic() < deadline:
            messages = consumer.fetch(topic, partition, offset, max_size=1 << 20)
            got += [m.body for m in messages if m.properties.get("MQTT_TOPIC") == name]
            offset = messages[-1].offset + 1 if messages else offset
            if not messages:
                time.sleep(0.05)
    return got


def _segments(b):
    return len(os.listdir(os.path.join(b.data_dir, "commitlog")))


@pytest.mark.integration
def test_a_device_publishing_across_segment_rolls_and_index_files_has_each_message_stored_once_in_order(mqtt_broker):
    """A device publishing QoS 1 messages one a read (each waits for its PUBACK, so each read is whole and takes the
    one-step turn) past several 64 KiB segments and 16-unit index files: at each roll and each next index file the
    burst writer stops short, the turn hands the message to the general path (``write_burst`` resumed from where the
    writer stopped), which rolls and stores it; every message is acknowledged and stored once, in order. The rolls
    counted in the log's files prove the hand-back ran: a message the turn dropped or stored twice there would show."""
    name = "rolls/dev"
    before = _segments(mqtt_broker)
    raw = Raw(mqtt_broker)
    assert raw.connect("roll-dev").reason_code == 0
    bodies = [b"m%03d-" % i + b"x" * 2000 for i in range(150)]
    for i, body in enumerate(bodies, 1):
        raw.send(wire.Publish(name, body, 1, False, False, i))
        assert raw.read() == wire.PubAck(i)
    assert _segments(mqtt_broker) >= before + 3  # 150 records of ~2 KiB: several rolls met by the turn
    assert _stored(mqtt_broker, name, len(bodies)) == bodies


@pytest.mark.integration
def test_a_read_with_a_pingreq_after_plain_publishes_is_answered_in_order_by_the_general_path(mqtt_broker):
    """A whole read of plain PUBLISHes followed by a PINGREQ: the turn takes the PUBLISHes and hands the rest back;
    the PUBACKs come before the PINGRESP, and the messages are stored once."""
    name = "rest/dev"
    raw = Raw(mqtt_broker)
    assert raw.connect("rest-dev").reason_code == 0
    raw.send(wire.Publish(name, b"first", 1, False, False, 1))
    assert raw.read() == wire.PubAck(1)
    for round_ in range(5):
        ids = [10 * round_ + 2, 10 * round_ + 3]
        raw.send_bytes(b"".join(wire.encode(wire.Publish(name, b"r%d-%d" % (round_, i), 1, False, False, i),
                                            wire.MQTT_5) for i in ids) + wire.encode(wire.PingReq(), wire.MQTT_5))
        assert [raw.read() for _ in range(3)] == [wire.PubAck(ids[0]), wire.PubAck(ids[1]), wire.PingResp()]
    want = [b"first"] + [b"r%d-%d" % (r, 10 * r + k) for r in range(5) for k in (2, 3)]
    assert _stored(mqtt_broker, name, len(want)) == want
