"""The zero-copy send (server/zerocopy.py): records go from a map to the socket, in order, whatever the socket takes
per call; a send held up past ``limits.MAX_PINNED_SEND_S`` copies its rest out and lets the maps go."""

import mmap
import socket
import threading

import pytest
from gevent import socket as gsocket

from metaq import limits
from metaq.store import limits as store_limits
from metaq.server import zerocopy
from metaq.server.zerocopy import ZeroCopySender, send_ranges_py
from metaq.store.gather import MappedRecords
from tests.harness.sockets import drain

try:
    from metaq.native._bytes import send_ranges as send_ranges_c
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


@pytest.mark.skipif(send_ranges_c is None, reason="metaq.native._bytes was not built")
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
    sender = ZeroCopySender(clock=lambda: 0.0)  # a clock that stands still: the hold limit is never reached
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
    held = []
    wait = stalled.wait

    def waiting(fd, timeout):
        held.append(mm_held(mm))  # while the send waits on the socket it holds the map
        wait(fd, timeout)

    stalled.wait = waiting
    sender = ZeroCopySender(clock=stalled.clock, wait=stalled.wait)
    sender.stamp(bufs)  # read at 100.0 (the fake clock)
    sock = Sock(a)
    sender.send(sock, bufs)
    stalled.got += drain(b, 0.2)  # what the socket still held, then what went the copying way
    assert bytes(stalled.got + sock.rest) == want
    assert sender.copied_out == copied and (len(sock.rest) > 0) == bool(copied)
    assert held[0] is True
    mm.close()  # once the send is over (copied out or sent whole), no map is held
    a.close()
    b.close()


def mm_held(mm):
    """True when something holds a view of ``mm`` (it cannot be unmapped)."""
    try:
        mm.resize(len(mm))
    except BufferError:
        return True
    except (OSError, SystemError, ValueError):
        return False
    return False


@pytest.mark.parametrize("age, copied", [(limits.MAX_PINNED_SEND_S, 0), (limits.MAX_PINNED_SEND_S + 0.001, 1)])
def test_the_hold_limit_counts_from_the_read_not_from_the_first_refused_send(tmp_path, age, copied):
    """A reply read, then kept waiting (behind a flush, another reply...) before its send: at the limit it still goes
    from the maps; one past it, it is copied out before any byte is sent from a map."""
    _s, read = stored(tmp_path)
    records = read(0, 20_000)
    want = records.joined()
    now = [100.0]
    sender = ZeroCopySender(clock=lambda: now[0])
    sender.stamp([records])
    now[0] += age
    a, b = pair()
    sock = Sock(a)
    sender.send(sock, [b"v\r\n", records])
    assert drain(b, 0.2) + bytes(sock.rest) == b"v\r\n" + want
    assert sender.copied_out == copied and bytes(sock.rest) == (b"v\r\n" + want if copied else b"")
    assert sender.sent_mapped == 1 - copied
    a.close()
    b.close()


def test_records_fully_sent_are_let_go_before_the_copied_out_rest_is_sent(tmp_path):
    """A send of several segments' records copied out past the limit: the records it had sent whole hold their map
    no longer while the copied rest goes (a reader that reads nothing keeps that going up to the socket timeout)."""
    from tests.harness.store import NOW, open_store

    s = open_store(tmp_path / "d", segment_size=64 << 10, index_file_units=4096)
    for i in range(400):
        s.put("test", 0, 0, b"r%04d-" % i * (1 + i % 200), NOW)
    views = s.read_joined("test", 0, 0, 1 << 20, mapped=True).views
    small = s.read_joined("test", 0, 0, 200, mapped=True).views[0]  # a record of the first segment
    seg0 = small.view.obj
    views[0].release()  # not sent: only ``small`` holds the first segment's map
    s.close(NOW)
    bufs = [b"value %d 1\r\n" % len(small), small, b"value 1 2\r\n"] + views[1:]
    a, b = pair(sndbuf=4096)
    stalled = Stalled(b, limits.MAX_PINNED_SEND_S + 1)
    seen = []

    class Rest(Sock):
        def sendall(self, data):
            seen.append(mm_held(seg0))
            super().sendall(data)

    sender = ZeroCopySender(clock=stalled.clock, wait=stalled.wait)
    sender.stamp(bufs)
    sender.send(Rest(a), bufs)
    assert sender.copied_out == 1 and seen and seen[0] is False
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

    with pytest.raises(OSError, match="cut from the log"):
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


def sent_until_refused(records, bufs, on_wait=None):
    """Send ``bufs`` with a tiny socket buffer, ``on_wait(got)`` called at every wait; (the error raised or None,
    every byte the reader got)."""
    a, b = pair(sndbuf=4096)
    got = bytearray()

    def wait(_fd, _timeout):
        got.extend(drain(b))
        if on_wait is not None:
            on_wait(got)

    err = None
    try:
        ZeroCopySender(clock=lambda: 0.0, wait=wait).send(a, bufs)
    except OSError as exc:
        err = exc
    got.extend(drain(b, 0.2))
    a.close()
    b.close()
    return err, bytes(got)


def test_records_cut_between_their_read_and_the_first_send_are_never_sent(tmp_path):
    """The reply was read, then the log cut before its send began (the reply waited behind another send, or for a
    flush): the send that never waits still checks first, and sends nothing (the cut bytes are zeros now)."""
    from tests.harness.store import NOW

    s, read = stored(tmp_path)
    records = read(300)  # records 300..399
    s.truncate_log(s._parts[("test", 0)].unit(300)[0], NOW)
    err, got = sent_until_refused(records, [b"value %d 1\r\n" % len(records), records])
    assert err is not None and "cut from the log" in str(err)
    assert got == b""  # not even the header: it goes in the same sendmsg as the records


def rewrite_after_cut(s, k):
    """Cut the log at record ``k`` of test-0 and write records of the same sizes but other bytes there (a slave
    taking its new master's records)."""
    from tests.harness.store import NOW

    report = s.truncate_log(s._parts[("test", 0)].unit(k)[0], NOW)
    for i in range(k, 400):
        s.put("test", 0, 0, b"X%04d-" % i * (1 + i % 200), NOW)
    return report


def test_records_cut_and_written_again_with_the_same_sizes_during_a_send_are_not_sent(tmp_path):
    """The CRCs of the records written again pass: only their positions tell they are not the records read."""
    s, read = stored(tmp_path)
    records = read()
    want = records.joined()
    cut = []

    def on_wait(got):
        if len(got) > 50_000 and not cut:
            cut.append(rewrite_after_cut(s, 300))

    err, got = sent_until_refused(records, [records], on_wait)
    assert cut and b"X0300-" in s.read("test", 0, 300, 100).views[0].tobytes()  # written again
    assert err is not None and 50_000 < len(got) < len(want) and want.startswith(got)


def test_a_record_partly_sent_when_the_log_is_cut_inside_it_is_never_finished_with_new_bytes(tmp_path):
    """Old head + new tail would be a record no one wrote: the send stops inside it, the connection fails."""
    s, read = stored(tmp_path)
    records = read()
    want = records.joined()
    lens = [b - a for a, b in records.pairs()]
    info = {}

    def on_wait(got):
        if len(got) > 50_000 and not info:
            k = pos = 0
            while pos + lens[k] <= len(got):  # the record the send is inside of
                pos += lens[k]
                k += 1
            info.update(k=k, inside=pos < len(got))
            rewrite_after_cut(s, k)

    err, got = sent_until_refused(records, [records], on_wait)
    assert info["inside"] or info["k"] > 0
    assert err is not None and len(got) < len(want) and want.startswith(got)


def test_records_of_segments_a_cut_deletes_are_not_sent_from_the_map_still_held(tmp_path):
    """A cut zeroes its own segment and deletes the later ones: their maps, held by the reply, keep the old bytes
    (CRCs pass), but the log no longer has those records: they are not sent."""
    from tests.harness.store import NOW, open_store

    s = open_store(tmp_path / "d", segment_size=64 << 10, index_file_units=4096)
    for i in range(400):
        s.put("test", 0, 0, b"r%04d-" % i * (1 + i % 200), NOW)
    views = s.read_joined("test", 0, 0, 1 << 20, mapped=True).views
    assert len(views) >= 3
    last = views[-1]
    report = s.truncate_log(s._parts[("test", 0)].unit(10)[0], NOW)  # a cut in the first segment
    assert report.deleted_segments and last.joined()  # the held map still reads
    err, got = sent_until_refused(last, [b"x" * 10, last])
    assert err is not None and got == b""


def test_a_cut_past_the_records_of_a_reply_lets_it_go_whole(tmp_path):
    """Records below every cut since their read are what was read: the reply is sent, from the maps."""
    s, read = stored(tmp_path)
    records = read(0, 170_000)
    want = records.joined()
    last = len(list(records.pairs()))
    assert last < 400
    rewrite_after_cut(s, last)  # cut exactly at the end of the reply's last record, then written again
    err, got = sent_until_refused(records, [records])
    assert err is None and got == want


@pytest.mark.parametrize("cuts, whole",
                         [(store_limits.MAX_CUTS_REMEMBERED, True), (store_limits.MAX_CUTS_REMEMBERED + 1, False)])
def test_the_log_remembers_where_its_latest_cuts_were_and_older_replies_fail(tmp_path, cuts, whole):
    """A reply read before more cuts than the log remembers cannot tell whether they reached it: it is not sent."""
    from tests.harness.store import NOW

    s, read = stored(tmp_path)
    records = read(0, 170_000)
    want = records.joined()
    at = s._parts[("test", 0)].unit(len(list(records.pairs())))[0]  # the end of the reply's records
    s.truncate_log(at, NOW)
    for _ in range(cuts - 1):
        s.put("test", 0, 0, b"again", NOW)
        s.truncate_log(at, NOW)
    assert s._log.cuts == cuts
    err, got = sent_until_refused(records, [records])
    assert (err is None and got == want) if whole else (err is not None and got == b"")


def text_connection(sender):
    """A text connection on a gevent socket pair (tiny send buffer) with the zero-copy ``sender``; (connection, the
    peer's end)."""
    import types

    from metaq.serving.connections import ConnectionLimits
    from metaq.server.text.connection import Connection

    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    ga = gsocket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=a.detach())
    ga.settimeout(600)  # what Connection.receive leaves: idle_timeout_s
    front = types.SimpleNamespace(rules=ConnectionLimits(600, 30), max_line_bytes=1 << 16, max_body_bytes=1 << 20,
                                  dispatcher=types.SimpleNamespace(max_transfer=1 << 20, put_path=None),
                                  zero_copy=sender,
                                  stats=None, flusher=None, fast_puts=None)
    conn = Connection(ga, ("127.0.0.1", 1), 1, front)
    assert conn.zero_copy is sender
    return conn, gsocket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=b.detach())


def test_a_reply_queued_behind_another_send_holds_no_map_and_is_sent_as_read_after_a_cut(tmp_path):
    """A long poll's reply read while the connection's writer is stuck in a partial send waits for the write lock:
    it copies its records out (checked) at once, so it holds no map while it waits and a cut of the log meanwhile
    does not change what it sends (the records as read, as the copying path sends them)."""
    import gevent

    from tests.harness.store import NOW

    s, read = stored(tmp_path)
    first = read(0, 170_000)  # records 0..299 or so
    now = [100.0]
    sender = ZeroCopySender(clock=lambda: now[0], wait=lambda fd, t: gevent.sleep(0.005))
    conn, peer = text_connection(sender)
    h1 = b"value %d 1\r\n" % len(first)
    want1 = first.joined()
    sender.stamp([first])
    g1 = gevent.spawn(conn.send, [h1, first], len(first))
    gevent.sleep(0.05)  # g1 stuck in its send: nobody reads
    k = len(list(first.pairs()))
    second = read(k)
    want2 = second.joined()
    h2 = b"value %d 2\r\n" % len(second)
    reply2 = [h2, second]
    sender.stamp(reply2)
    g2 = gevent.spawn(conn.send, reply2, len(second))
    gevent.sleep(0.05)
    assert not g2.ready() and type(reply2[1]) is bytes and sender.unpinned == 1  # waiting, holding no map
    s.truncate_log(s._parts[("test", 0)].unit(k)[0], NOW)  # a slave's handshake cut: the second's records zeroed
    got = bytearray()
    total = len(h1) + len(first) + len(h2) + len(second)
    peer.settimeout(10)
    while len(got) < total:
        chunk = peer.recv(1 << 16)
        if not chunk:
            break
        got += chunk
    gevent.joinall([g1, g2], timeout=10)
    assert bytes(got) == h1 + want1 + h2 + want2 and not conn.closed
    conn.close()
    peer.close()


def test_a_reply_queued_while_a_send_waits_past_the_hold_limit_lets_every_map_go(tmp_path):
    """The reply being sent copies its rest out at the limit (counted from its read); the one queued behind it
    copied itself out when it queued: nothing holds a map once the limit has passed, whatever the reader does."""
    import gevent

    s, read = stored(tmp_path)
    first = read(0, 170_000)
    second = read(len(list(first.pairs())))
    now = [100.0]
    sender = ZeroCopySender(clock=lambda: now[0], wait=lambda fd, t: gevent.sleep(0.005))
    conn, peer = text_connection(sender)
    r1 = [b"value %d 1\r\n" % len(first), first]
    r2 = [b"value %d 2\r\n" % len(second), second]
    want = r1[0] + first.joined() + r2[0] + second.joined()
    sender.stamp(r1 + r2)
    s.close(0)  # only the replies hold the map now
    mm = first.view.obj
    del first, second
    g1 = gevent.spawn(conn.send, r1, 1)
    gevent.sleep(0.05)
    g2 = gevent.spawn(conn.send, r2, 1)
    gevent.sleep(0.05)
    assert mm_held(mm) and sender.copied_out == 0 and sender.unpinned == 1
    now[0] += limits.MAX_PINNED_SEND_S + 0.001
    gevent.sleep(0.05)  # the waiting send sees the clock past the limit: copies its rest, lets its map go
    assert sender.copied_out == 1 and not mm_held(mm)
    got = bytearray()
    peer.settimeout(10)
    while len(got) < len(want):
        chunk = peer.recv(1 << 16)
        if not chunk:
            break
        got += chunk
    gevent.joinall([g1, g2], timeout=10)
    assert bytes(got) == want and not conn.closed
    conn.close()
    peer.close()


def test_a_burst_that_waits_for_a_flush_holds_no_map_meanwhile(tmp_path):
    """A get answered in a burst with puts (sync mode) waits for their flush before its send: its records are copied
    out before that wait (checked), and the reply is the same."""
    import types

    import gevent

    _s, read = stored(tmp_path)
    records = read(0, 20_000)
    want = records.joined()
    sender = ZeroCopySender(clock=lambda: 0.0)
    conn, peer = text_connection(sender)
    seen = []
    reply = [b"value %d 1\r\n" % len(records), records]
    conn.put_path = types.SimpleNamespace(settle=lambda pos, since=None: seen.append([type(b) for b in reply]))
    g = gevent.spawn(conn._emit, [reply, b"result 200 1 2\r\n"], [(1, (2,))], 123)
    total = b"value %d 1\r\n" % len(want) + want + b"result 200 1 2\r\n"
    got = bytearray()
    peer.settimeout(10)
    while len(got) < len(total):
        chunk = peer.recv(1 << 16)
        if not chunk:
            break
        got += chunk
    g.join(10)
    assert seen == [[bytes, bytes]] and sender.unpinned == 1
    assert bytes(got) == total
    conn.close()
    peer.close()
