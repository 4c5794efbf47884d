"""The zero-copy send (server/zerocopy.py): records go from a map to the socket, in order, whatever the socket takes
per call; a send held up past ``limits.MAX_PINNED_SEND_S`` copies its rest out and lets the maps go."""

import mmap
import socket
import threading

import pytest
from gevent import socket as gsocket

from metaq import limits
from metaq.server import zerocopy
from metaq.server.zerocopy import ZeroCopySender, send_ranges_py
from metaq.store.gather import MappedRecords

try:
    from metaq._speedups import send_ranges as send_ranges_c
except ImportError:
    send_ranges_c = None

SENDERS = [pytest.param(send_ranges_py, id="python")] + (
    [pytest.param(send_ranges_c, id="built")] if send_ranges_c is not None else [])


def a_map(size=1 << 16):
    """An anonymous map filled with a pattern, and ranges over it (native int64 pairs) that skip bits of it."""
    mm = mmap.mmap(-1, size)
    mm[:] = bytes(i * 7 % 251 for i in range(size))
    pairs = []
    pos = 3
    while pos + 40 < size:
        ln = 20 + pos % 300
        pairs.append((pos + 5, min(pos + ln, size)))
        pos += ln
    return mm, pairs


def stored(path, count=400):
    """A store holding ``count`` records of test-0 (about 300 KiB; one segment) and a function reading them checked
    in place: ``read(offset, max_size)`` gives one ``MappedRecords``."""
    from tests.harness.store import NOW, open_store

    s = open_store(path, segment_size=4 << 20, index_file_units=4096)
    for i in range(count):
        s.put("test", 0, 0, b"r%04d-" % i * (1 + i % 200), NOW)

    def read(offset=0, max_size=1 << 20):
        views = s.read_joined("test", 0, offset, max_size, mapped=True).views
        assert len(views) == 1
        return views[0]

    return s, read


def packed(pairs):
    from array import array

    return array("q", [x for p in pairs for x in p]).tobytes()


def expected(head, mm, pairs):
    return head + b"".join(mm[a:b] for a, b in pairs)


def pair(sndbuf=None, green=False):
    """A connected pair; ``green``: the sending end a gevent socket, as the broker's are."""
    a, b = socket.socketpair()
    if sndbuf:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    if green:
        a = gsocket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=a.detach())
    else:
        a.setblocking(False)
    return a, b


def drain(sock, timeout=0.0):
    out = bytearray()
    sock.settimeout(timeout)
    try:
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            out += chunk
    except (BlockingIOError, socket.timeout):
        pass
    return bytes(out)


@pytest.mark.parametrize("send", SENDERS)
def test_send_ranges_sends_from_any_position_and_says_how_much(send):
    mm, pairs = a_map()
    ranges = packed(pairs)
    head = b"value 123 7\r\n"
    whole = expected(head, mm, pairs[:1024 - 1])  # one call: at most IOV_MAX pieces (the head is one)
    for pos in (0, 5, len(head), len(head) + 3, len(head) + 700):
        a, b = pair()
        n = send(a.fileno(), head, mm, ranges, pos)
        assert 0 < n and drain(b) == whole[pos:pos + n]
        a.close()
        b.close()


@pytest.mark.skipif(send_ranges_c is None, reason="metaq._speedups was not built")
def test_the_built_send_equals_the_python_reference_on_a_full_socket_and_bad_ranges():
    mm, pairs = a_map()
    for send in (send_ranges_py, send_ranges_c):
        a, b = pair(sndbuf=4096)
        sent = 0
        with pytest.raises(BlockingIOError):
            while True:
                sent += send(a.fileno(), b"h", mm, packed(pairs), sent)
        assert drain(b, 0.2) == expected(b"h", mm, pairs)[:sent]
        with pytest.raises(ValueError):
            send(a.fileno(), b"", mm, packed([(0, 10), (10, len(mm) + 1)]), 0)
        assert send(a.fileno(), b"", mm, packed([]), 0) == 0
        a.close()
        b.close()


def test_a_reply_larger_than_the_socket_buffer_arrives_whole_for_a_slow_reader(tmp_path):
    """Partial sends (a tiny SO_SNDBUF, a reader taking small bites with pauses) continue where they stopped;
    acks before and after the records keep their order."""
    _store, read = stored(tmp_path)
    records = read()
    assert len(records) > 200_000
    bufs = [b"result 200 1 1\r\nx", b"value %d 2\r\n" % len(records), records, b"result 200 1 3\r\ny"]
    want = b"".join(bytes(x) if not isinstance(x, MappedRecords) else x.joined() for x in bufs)
    a, b = pair(sndbuf=4096, green=True)
    got = bytearray()

    def reader():
        b.settimeout(10)
        while len(got) < len(want):
            chunk = b.recv(3000)
            if not chunk:
                break
            got.extend(chunk)
            threading.Event().wait(0.0005)

    t = threading.Thread(target=reader)
    t.start()
    sender = ZeroCopySender()
    sender.send(a, bufs)
    t.join(10)
    assert bytes(got) == want and sender.copied_out == 0
    a.close()
    b.close()


class Stalled:
    """A reader that reads nothing until the sender waits, then lets the clock reach ``now`` and reads what is
    there (the test's ``wait``)."""

    def __init__(self, sock, jump):
        self.sock = sock
        self.jump = jump
        self.now = 100.0
        self.got = bytearray()
        self.waits = 0

    def clock(self):
        return self.now

    def wait(self, fd, timeout):
        self.waits += 1
        if self.waits == 1:
            self.now += self.jump  # the first wait lasts that long
        self.got += drain(self.sock)


class Sock:
    """The sender's socket, whose ``sendall`` (the copied rest's way out) is kept aside to check its bytes."""

    def __init__(self, sock):
        self.sock = sock
        self.rest = bytearray()

    def fileno(self):
        return self.sock.fileno()

    def sendall(self, data):
        self.rest += data


@pytest.mark.parametrize("jump, copied", [(limits.MAX_PINNED_SEND_S, 0), (limits.MAX_PINNED_SEND_S + 0.001, 1)])
def test_a_send_holds_the_maps_up_to_the_limit_and_copies_out_past_it(tmp_path, jump, copied):
    s, read = stored(tmp_path)
    first, second = read(), read(300, 20_000)
    s.close(0)  # the store lets its maps go: only these replies hold them now
    mm = first.view.obj
    bufs = [b"value %d 1\r\n" % len(first), first, b"value %d 2\r\n" % len(second), second]
    want = b"".join(bytes(x) if not isinstance(x, MappedRecords) else x.joined() for x in bufs)
    a, b = pair(sndbuf=4096)
    stalled = Stalled(b, jump)
    sender = ZeroCopySender(clock=stalled.clock, wait=stalled.wait)
    sock = Sock(a)
    sender.send(sock, bufs)
    stalled.got += drain(b, 0.2)  # what the socket still held, then what went the copying way
    assert bytes(stalled.got + sock.rest) == want
    assert sender.copied_out == copied and (len(sock.rest) > 0) == bool(copied)
    # Past the limit every map the send held was let go (the map can be unmapped); at it they are still held.
    if copied:
        mm.close()
    else:
        with pytest.raises(BufferError):
            mm.close()
    a.close()
    b.close()


def test_a_connection_closed_during_a_send_sends_nothing_to_the_socket_that_takes_its_number(tmp_path):
    _store, read = stored(tmp_path)
    records = read()
    a, b = pair(sndbuf=4096)
    fd = a.fileno()
    others = []

    def wait(_fd, _timeout):  # meanwhile another greenlet closes the connection and a new one is accepted
        a.close()
        others.append(socket.socketpair())

    with pytest.raises(OSError):
        ZeroCopySender(wait=wait).send(a, [b"value 1 1\r\n", records])
    c, d = others[0]
    assert fd in (c.fileno(), d.fileno())  # the number was taken again
    assert drain(c, 0.2) == b"" and drain(d, 0.2) == b""
    for s in (b, c, d):
        s.close()


def test_records_cut_from_the_log_during_a_send_are_not_sent_and_the_connection_fails(tmp_path):
    """A send that waited checks its records again when the log was cut since they were read (a slave cutting its
    log zeroes bytes in place, then writes its master's records there): they are never sent; the send fails (the
    connection closes with the reply unfinished)."""
    from tests.harness.store import NOW

    s, read = stored(tmp_path)
    records = read()
    want = records.joined()
    a, b = pair(sndbuf=4096)
    got = bytearray()
    cut = []

    def wait(_fd, _timeout):
        got.extend(drain(b))
        if len(got) > 50_000 and not cut:  # records not sent yet are cut
            cut.append(s.truncate_log(s._parts[("test", 0)].unit(300)[0], NOW))

    with pytest.raises(OSError, match="changed"):
        ZeroCopySender(wait=wait).send(a, [records])
    got.extend(drain(b, 0.2))
    assert cut[0].records == 100
    assert 50_000 < len(got) < len(want) and want.startswith(bytes(got))
    a.close()
    b.close()


def test_records_held_for_a_send_survive_retention_dropped_page_tables_and_the_store_closing(tmp_path):
    from tests.harness.store import HOUR_MS, NOW, open_store

    s = open_store(tmp_path / "data", segment_size=4096, retention_hours=1)
    for i in range(300):
        s.put("test", 0, 0, b"r%04d-" % i * (1 + i % 9), NOW)
    want = b"".join(s.read_joined("test", 0, 0, 1 << 20).views)
    held = s.read_joined("test", 0, 0, 1 << 20, mapped=True).views  # one MappedRecords per 4 KiB segment
    held_again = s.read_joined("test", 0, 0, 1 << 20, mapped=True).views
    maps = [seg.file for seg in s._log.segments]
    s.mark_flushed(s.flush_log())
    s.checkpoint(NOW)
    assert len(s.retention(NOW + 2 * HOUR_MS).deleted_segments) > 3  # segments these replies hold, deleted
    assert all([f.drop_pages() for f in maps])  # and their page tables released (MADV_DONTNEED) under them

    def sent(views):
        a, b = pair()
        a.setblocking(True)
        got = bytearray()
        reader = threading.Thread(target=lambda: got.extend(drain(b, 2.0)))
        reader.start()
        ZeroCopySender().send(a, [b"value %d 1\r\n" % len(want)] + views)
        a.close()
        reader.join(10)
        b.close()
        return bytes(got)

    assert sent(held) == b"value %d 1\r\n" % len(want) + want
    s.close(NOW)  # the maps these still hold stay mapped until they let go
    assert sent(held_again) == b"value %d 1\r\n" % len(want) + want


def test_the_zero_copy_path_is_taken_only_with_the_built_helper():
    assert zerocopy.AVAILABLE == (send_ranges_c is not None and zerocopy.send_ranges is send_ranges_c)
