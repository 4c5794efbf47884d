"""A gRPC connection cut for flooding (GOAWAY ENHANCE_YOUR_CALM) against a real broker, raw sockets from several
loopback addresses: its address is refused new connections for a cooldown (``grpc.flood_penalty_s``), another
address is not, and the cut connection closes without reading what its client keeps sending."""

import socket
import time

import hpack
import pytest

from tests.rmq5.test_grpc_connection import (END_HEADERS, END_STREAM, ENHANCE_YOUR_CALM, HEADERS, PING, PREFACE,
                                             SETTINGS, WINDOW_UPDATE, Frames, answered, ended, frame, goaway_code,
                                             header_block)
from metaq.client.local import BrokerProcess, free_port, small_config
from tests.harness.replication import stats

pytestmark = pytest.mark.integration

MAX_CONTROL = 50
PENALTY_S = 1.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    wd = tmp_path_factory.mktemp("grpccalm")
    cfg = small_config(wd / "data", grpc={"port": free_port(), "max_control_frames": MAX_CONTROL,
                                          "flood_penalty_s": PENALTY_S})
    b = BrokerProcess(wd, cfg).start()
    yield b
    b.kill()


def connect(b, source):
    """A raw peer of ``b``'s gRPC port from the loopback address ``source`` (each test its own)."""
    return Frames.over(socket.create_connection(("127.0.0.1", b.config["grpc"]["port"]), timeout=10,
                                                source_address=(source, 0)))


def flood_until_cut(b, source):
    """A connection from ``source`` sending PINGs past the control budget; what it read (its GOAWAY, its end)."""
    raw = connect(b, source)
    try:
        raw.send(PREFACE + frame(SETTINGS) + frame(PING, 0, 0, b"12345678") * (MAX_CONTROL + 1))
        got = raw.read(lambda got: "closed" in got)
        assert goaway_code(got) == ENHANCE_YOUR_CALM and "closed" in got, got[-3:]
    finally:
        raw.close()


def served(b, source):
    """True when a connection from ``source`` is served (a call answered), False when it is closed at once with
    nothing sent (refused)."""
    raw = connect(b, source)
    try:
        try:
            raw.send(PREFACE + frame(SETTINGS) + frame(HEADERS, END_HEADERS | END_STREAM, 1,
                                                       header_block("Heartbeat")))
        except OSError:
            return False
        got = raw.read(lambda got: 1 in answered(got) or "closed" in got)
        if 1 in answered(got):
            return True
        assert got == ["closed"], got  # refused: not a frame
        return False
    finally:
        raw.close()


def test_an_address_cut_for_flooding_is_refused_within_its_cooldown_and_served_after_it(broker):
    assert served(broker, "127.0.0.2") and served(broker, "127.0.0.3")
    flood_until_cut(broker, "127.0.0.2")
    cut = time.monotonic()
    assert not served(broker, "127.0.0.2")  # at once: within its cooldown
    assert served(broker, "127.0.0.3")  # another address goes on
    summary = stats(broker)
    assert int(summary["grpc_flood_refused"]) >= 1 and int(summary["grpc_flood_penalized"]) >= 1
    time.sleep(max(0.0, cut + PENALTY_S + 0.2 - time.monotonic()))
    assert served(broker, "127.0.0.2")  # past its cooldown


def test_a_connection_cut_for_flooding_closes_without_reading_what_its_client_keeps_sending(broker):
    """Past its GOAWAY the cut connection reads at most limits.GRPC_CALM_LINGER_BYTES, then closes: the client,
    still writing, is reset long before it could write 128 MiB (a connection read for the whole linger takes
    them all)."""
    raw = connect(broker, "127.0.0.4")
    try:
        raw.send(PREFACE + frame(SETTINGS) + frame(PING, 0, 0, b"12345678") * (MAX_CONTROL + 1))
        got = raw.read(lambda got: goaway_code(got) is not None)
        assert goaway_code(got) == ENHANCE_YOUR_CALM, got[-3:]
        chunk, sent = frame(PING, 0, 0, b"12345678") * ((1 << 20) // 17), 0
        with pytest.raises(OSError):  # reset (or a broken pipe): the broker closed with bytes unread
            while sent < 128 << 20:
                raw.sock.sendall(chunk)
                sent += len(chunk)
    finally:
        raw.close()


def test_a_ping_after_each_answer_read_is_a_bandwidth_probe_and_costs_nothing(broker):
    """A client that PINGs as it reads each answer (grpc-java's bandwidth probe at each read, grpcio's paced) is
    not cut however many calls it makes: one PING a DATA frame the port sent is free (limits.GRPC_PINGS_PER_DATA);
    PINGs past that credit still count (the flood tests)."""
    raw = connect(broker, "127.0.0.5")
    try:
        raw.send(PREFACE + frame(SETTINGS))
        for i in range(2 * MAX_CONTROL):
            sid = 2 * i + 1
            raw.send(frame(HEADERS, END_HEADERS, sid, header_block("Heartbeat")) + frame(0, END_STREAM, sid, b"\0" * 5))
            got = raw.read(lambda got, sid=sid: sid in answered(got) or "closed" in got)
            assert sid in answered(got) and goaway_code(got) is None, (i, got[-3:])
            raw.send(frame(PING, 0, 0, i.to_bytes(8, "big")))
        got = raw.read(lambda got: any(f != "closed" and f[0] == PING for f in got) or "closed" in got)
        assert goaway_code(got) is None and "closed" not in got, got[-3:]
    finally:
        raw.close()


def test_windows_opened_a_byte_at_a_time_earn_no_credit_and_the_dribble_is_cut(broker):
    """The data dribble: a client whose windows start at 0 opens them a byte at a time, so that each answer leaves
    in 1-byte DATA frames; such slivers earn no WINDOW_UPDATE credit, so its updates count as frames that do no
    work and the connection is cut (GOAWAY ENHANCE_YOUR_CALM) within the budget."""
    raw = connect(broker, "127.0.0.6")
    try:
        raw.send(PREFACE + frame(SETTINGS, 0, 0, (4).to_bytes(2, "big") + (0).to_bytes(4, "big")))  # window 0
        sids = [2 * i + 1 for i in range(10)]
        raw.send(b"".join(frame(HEADERS, END_HEADERS, sid, header_block("Heartbeat")) +
                          frame(0, END_STREAM, sid, b"\0" * 5) for sid in sids))
        got = []
        while sids:  # a byte more of each answer not yet whole, until all are (or the connection is cut)
            try:
                raw.send(b"".join(frame(WINDOW_UPDATE, 0, sid, (1).to_bytes(4, "big")) for sid in sids))
            except OSError:
                break
            n = len(sids)
            now = raw.read(lambda now, n=n: sum(1 for f in now if f != "closed" and f[0] == 0) >= n or
                           answered(now) or ended(now), timeout=5)
            got += now
            if ended(got):
                break
            sids = [sid for sid in sids if sid not in answered(got)]
        assert goaway_code(got) == ENHANCE_YOUR_CALM, (len(got), answered(got), got[-3:])
    finally:
        raw.close()


def test_data_on_a_plain_answers_stream_counts_and_one_past_the_budget_ends_the_connection(broker):
    """A request that is no gRPC call (415) is answered and its stream left open for the rest of its body; each DATA
    frame that follows goes to no call and counts as a frame that does no work, full frames too: past the budget
    the connection is cut (GOAWAY ENHANCE_YOUR_CALM) rather than read for free."""
    raw = connect(broker, "127.0.0.7")
    block = hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in (
        (":method", "POST"), (":scheme", "http"), (":path", "/"), (":authority", "x"), ("content-type", "text/plain"))])
    try:
        raw.send(PREFACE + frame(SETTINGS) + frame(HEADERS, END_HEADERS, 1, block))
        try:
            for _ in range(MAX_CONTROL + 1):
                raw.send(frame(0, 0, 1, b"\0" * 1024))
        except OSError:  # cut while sending: read what came before
            pass
        got = raw.read(lambda got: "closed" in got)
        assert goaway_code(got) == ENHANCE_YOUR_CALM and "closed" in got, got[-3:]
        assert any(f != "closed" and f[0] == HEADERS and b"415" in hpack.Decoder().decode(f[3], raw=True)[0][1]
                   for f in got), got[:4]
    finally:
        raw.close()
