"""Issue 22 point 2: gets whose records go from the segment maps to the socket answer byte for byte as gets whose
records are gathered into a buffer first. Two brokers, one with ``broker.zero_copy_reads`` (opt-in) and one
without, are given the same puts; the same requests then get the same bytes back: plaintext and TLS (TLS always
takes the copying path), pipelined bursts, a long poll woken by a put, a reader with a tiny receive buffer that
reads slowly (the broker's sends stop part way and go on), and a corrupt record (served up to it, then 512)."""

import glob
import os
import re
import shutil
import socket
import ssl
import time

import pytest

from metaq.client.local import small_config
from metaq.client.raw import TextClient
from metaq.protocol import events as ev
from metaq.protocol.text import serialize
from metaq.server import zerocopy
from tests.harness.broker import wait_for
from tests.harness.pki import Pki

pytestmark = pytest.mark.skipif(not zerocopy.AVAILABLE, reason="metaq.native._bytes (send_ranges) was not built, or "
                                "METAQ_PURE_PYTHON is set: the broker takes the copying path only")

TOPIC = "zc"
HEADER = re.compile(rb"(?:value|result (\d+)) (\d+) (-?\d+)\r\n")


def payload(i):
    return b"zc-%04d-" % i + bytes([97 + i % 26]) * (100 + i * 37 % 9000)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


def start_pair(broker_factory, tmp_path, pki):
    """(zero-copy broker, copying broker) over copies of one log (the message ids hold the time they were stored),
    TLS permissive (plaintext and TLS on the text port)."""
    configs = []
    for name, zero_copy in (("zc", True), ("copy", False)):
        cfg = small_config(tmp_path / name / "data", broker={"zero_copy_reads": zero_copy},
                           topics=[{"name": "*", "partitions": 4}])
        cfg["security"] = {"tls": pki.tls_config("permissive")}
        configs.append(cfg)
    zc = broker_factory(configs[0], workdir=tmp_path / "zc")
    with TextClient("127.0.0.1", zc.port) as c:
        for i in range(400):
            assert c.put_ok(TOPIC, payload(i), i % 2)[2] == i // 2
    assert zc.stop() == 0
    shutil.copytree(zc.data_dir, configs[1]["broker"]["data_dir"])
    zc.start()
    return zc, broker_factory(configs[1], workdir=tmp_path / "copy")


def connect(port, tls=None, rcvbuf=None):
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: the window stays small
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    if tls is not None:
        sock = tls.wrap_socket(sock, server_hostname="127.0.0.1")
    return sock


def read_replies(sock, count, bite=1 << 20, pause=0.0):
    """``count`` replies as raw bytes (header and body each), read ``bite`` bytes at a time with ``pause``s."""
    buf = bytearray()
    out = []
    while len(out) < count:
        m = HEADER.match(buf)
        if m is not None and len(buf) >= m.end() + int(m.group(2)):
            end = m.end() + int(m.group(2))
            out.append(bytes(buf[:end]))
            del buf[:end]
            continue
        chunk = sock.recv(bite)
        assert chunk, "the broker closed after %d replies" % len(out)
        buf += chunk
        if pause:
            time.sleep(pause)
    assert not buf
    return out


def gets():
    frames = []
    opaque = 0
    for partition in (0, 1, 3):
        for offset in (0, 1, 17, 150, 199, 200, 5000):
            for max_size in (1, 1000, 64 << 10, 1 << 20, 8 << 20):
                opaque += 1
                frames.append(serialize(ev.Get(TOPIC, "g", partition, offset, max_size, opaque)))
    return frames


def exchange(port, frames, tls=None, rcvbuf=None, bite=1 << 20, pause=0.0, burst=True):
    """The raw replies to ``frames``: sent as one pipelined burst, or one at a time."""
    with connect(port, tls, rcvbuf) as sock:
        if burst:
            sock.sendall(b"".join(frames))
            return read_replies(sock, len(frames), bite, pause)
        out = []
        for f in frames:
            sock.sendall(f)
            out += read_replies(sock, 1, bite, pause)
        return out


def zero_copy_stats(port):
    with TextClient("127.0.0.1", port) as c:
        s = c.stats_dict()
    return s["zero_copy_reads"], int(s.get("zero_copy_sent", 0)), int(s.get("zero_copy_copied_out", 0))


def codes(replies):
    return [int(HEADER.match(r).group(1) or 0) for r in replies]  # 0: a value


def test_gets_answer_byte_for_byte_as_the_copying_path_plain_and_tls(broker_factory, tmp_path, pki):
    zc, copy = start_pair(broker_factory, tmp_path, pki)
    frames = gets()
    tls = ssl.create_default_context(cafile=pki.ca)
    for burst in (True, False):
        want = exchange(copy.port, frames, burst=burst)
        assert exchange(zc.port, frames, burst=burst) == want
        assert exchange(zc.port, frames, tls=tls, burst=burst) == want
        assert exchange(copy.port, frames, tls=tls, burst=burst) == want
    kinds = codes(want)
    assert kinds.count(0) == 50 and 404 in kinds
    # The zero-copy broker sent records from its maps (both passes, plaintext); the copying one never did.
    on, sent, copied = zero_copy_stats(zc.port)
    # partitions 0 and 1 from 5 offsets each, misses past the ends
    assert on == "on" and sent + copied >= 2 * 50 and zero_copy_stats(copy.port)[0] == "off"
    assert sum(len(r) for r in want) > 10 << 20  # replies of up to 1 MiB, over several segments


def test_a_slow_reader_with_a_tiny_window_gets_the_same_bytes(broker_factory, tmp_path, pki):
    zc, copy = start_pair(broker_factory, tmp_path, pki)
    frames = [serialize(ev.Get(TOPIC, "g", p, o, 1 << 20, i)) for i, (p, o) in
              enumerate([(0, 0), (1, 3), (0, 100), (1, 150)])]
    want = exchange(copy.port, frames)
    got = exchange(zc.port, frames, rcvbuf=4096, bite=4096, pause=0.0005)
    assert got == want and sum(map(len, got)) > 2 << 20
    on, sent, copied = zero_copy_stats(zc.port)
    assert on == "on" and sent + copied >= 4  # every reply went the zero-copy way (copied out past the limit or not)


def test_a_long_poll_woken_by_a_put_gets_the_same_bytes(broker_factory, tmp_path, pki):
    zc, _copy = start_pair(broker_factory, tmp_path, pki)
    get = serialize(ev.Get(TOPIC, "g", 2, 0, 1 << 20, 9, max_wait_ms=20000))
    with connect(zc.port) as sock:
        sock.sendall(get)
        with TextClient("127.0.0.1", zc.port) as c:
            wait_for(lambda: c.stats_dict()["parked_gets"] == "1", 30, "the get parked")
            assert c.put_ok(TOPIC, b"woken" * 3000, 2)[2] == 0
        woken = read_replies(sock, 1)
    assert codes(woken) == [0] and b"woken" * 3000 in woken[0]
    assert zero_copy_stats(zc.port)[:2] == ("on", 1)  # the woken get's reply went from the map
    # The same record read again over TLS (the copying path; the message id is the same only on this broker):
    assert exchange(zc.port, [get], tls=ssl.create_default_context(cafile=pki.ca)) == woken


def flip_payload_byte(data_dir, i):
    """Flip one byte in the middle of message ``i``'s payload, in its segment file."""
    for seg in sorted(glob.glob(os.path.join(data_dir, "commitlog", "*"))):
        with open(seg, "r+b") as f:
            data = f.read()
            at = data.find(b"zc-%04d-" % i)
            if at >= 0:
                f.seek(at + 50)
                f.write(bytes([data[at + 50] ^ 0x04]))
                return
    raise AssertionError("message %d not found" % i)


def test_a_corrupt_record_is_refused_exactly_as_before(broker_factory, tmp_path, pki):
    brokers = start_pair(broker_factory, tmp_path, pki)
    for b in brokers:
        assert b.stop() == 0
        flip_payload_byte(b.data_dir, 20)  # partition 0, offset 10, in the first segment
        b.start()
    frames = [serialize(ev.Get(TOPIC, "g", 0, o, 1 << 20, o)) for o in (0, 5, 9, 10, 11)]
    zc, copy = brokers
    want = exchange(copy.port, frames)
    assert exchange(zc.port, frames) == want
    assert exchange(zc.port, frames, burst=False) == want
    assert codes(want) == [0, 0, 0, 512, 0]
    assert zero_copy_stats(zc.port)[1] > 0
    assert want[0].count(b"zc-") == 10 and b"zc-0020-" not in want[0]  # offsets 0..9, never the corrupt one
    assert b"offset 10" in want[3]
