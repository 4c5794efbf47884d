"""Zero-copy sends: a get's checked records go from the segment maps to the socket, with no copy of ours.

A reply read with ``MessageStore.read_joined(..., mapped=True)`` holds ``store.gather.MappedRecords``: its records
were checked in place (CRC included) and stay in the maps. ``send_buffers`` sends a list of replies' buffers
(``bytes`` and ``MappedRecords``) in order: each run of plain buffers before a ``MappedRecords`` is joined into the
head of its ``sendmsg`` (``send_ranges``, in C: one iovec per record, the GIL released during the call), so the
kernel copies the records straight from the page cache's mapped pages into the socket.

The socket is non-blocking (gevent): a call that cannot send everything sends what the socket takes and the rest
goes when it is writable again. Before every call that takes bytes of a ``MappedRecords`` (the first one included:
between the read and the send other greenlets ran) the records are checked against the cuts of the log
(``MappedRecords.intact``: a slave cutting its log zeroes bytes in place, deletes later segments, then writes other
records there): a reply a cut made since its read reached is never sent, its connection closes with it unfinished.
With no cut since the read that costs one comparison. Maps are held ``limits.MAX_PINNED_SEND_S`` at most from the
read (``stamp``): a send past it copies what it has not sent yet of every ``MappedRecords`` it holds into ordinary
buffers (checked), lets the maps go and finishes through the socket's ``sendall`` like any reply; records sent whole
are let go at once. A reply that must wait before its send (behind another reply's send on the connection's write
lock, or for a flush: text/connection.py) is copied out (``unpin``) before it waits. A slow reader therefore pins
maps for at most that long; the bytes it holds are bounded by its reply budget as before.

TLS connections never come here (an SSL socket has no scatter send and encrypts from a buffer of its own): their
gets read with ``mapped=False`` (text/dispatch.py), the copying path. Without the C helper the same: the pure-Python
``send_ranges_py`` (the twin the tests hold equal) makes a buffer object per record and would cost more than the
copy it saves.
"""

import errno
import os
import socket
import time
from array import array

from gevent.socket import wait_write

from metaq import limits, speedups
from metaq.store.gather import MappedRecords

#: iovecs per sendmsg (Linux's IOV_MAX).
IOV_MAX = 1024


def send_ranges_py(fd, head, log, ranges, pos):
    """One non-blocking ``sendmsg`` of ``head`` then the ``ranges`` (native int64 start/end pairs) of ``log``, from
    byte ``pos`` of that whole, at most ``IOV_MAX`` pieces; returns the bytes sent (BlockingIOError: none taken)."""
    view = memoryview(log)
    r = array("q")
    r.frombytes(ranges)
    pieces = []
    pos = max(pos, 0)
    if pos < len(head):
        pieces.append(memoryview(head)[pos:])
        pos = 0
    else:
        pos -= len(head)
    for a, b in zip(r[::2], r[1::2], strict=True):
        if len(pieces) >= IOV_MAX:
            break
        if a < 0 or b < a or b > len(view):
            raise ValueError("a range lies outside the buffer")
        if pos >= b - a:
            pos -= b - a
            continue
        pieces.append(view[a + pos:b])
        pos = 0
    if not pieces:
        return 0
    with socket.socket(fileno=os.dup(fd)) as s:
        return s.sendmsg(pieces, [], socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)


send_ranges = speedups.load("send_ranges", send_ranges_py)

#: True when the zero-copy path is worth taking (the C helper is built and wanted).
AVAILABLE = send_ranges is not send_ranges_py


class ZeroCopySender:
    """Sends a list of buffers (``bytes``-like and ``MappedRecords``) in order on a non-blocking socket.

    ``hold_s``: how long after its read (``stamp``) a reply may hold its maps before its unsent rest is copied out;
    ``clock`` and ``wait(fd, timeout)`` (wait for the socket to be writable; a timeout just returns) are
    given for tests."""

    def __init__(self, hold_s=limits.MAX_PINNED_SEND_S, clock=time.monotonic, wait=None):
        self.hold_s = hold_s
        self.clock = clock
        self.wait = wait or _wait_writable
        self.sent_mapped = 0  # MappedRecords sent whole from their maps (stats: the zero-copy path ran)
        self.copied_out = 0  # sends that passed hold_s and copied their rest (tests, logs)
        self.unpinned = 0  # replies copied out before their send: queued behind another send or a flush (stats)

    def stamp(self, bufs):
        """Note the read time of the reply ``bufs``' records: its maps are held ``hold_s`` at most from now."""
        now = self.clock()
        for buf in bufs:
            if type(buf) is MappedRecords and buf.born is None:
                buf.born = now

    def unpin(self, bufs):
        """Replace, in the list ``bufs``, each ``MappedRecords`` with a copy of its bytes (checked: OSError when a
        cut reached them) and let its map go: for a reply that must wait before its send (behind another reply's
        send, or for a flush), which must not hold maps meanwhile."""
        done = False
        for i, buf in enumerate(bufs):
            if type(buf) is MappedRecords:
                bufs[i] = _rest(b"", buf, 0)
                done = True
        self.unpinned += done

    def send(self, sock, bufs):
        """Send every buffer of ``bufs`` in order; raises OSError / socket.timeout as ``sendall`` does.

        Each ``MappedRecords`` is checked (``intact``: free with no cut of the log since its read) before every
        ``sendmsg`` that takes bytes of it (the loop may have run since its read, or since the last call), and let
        go once sent. Past ``hold_s`` from the earliest read (``stamp``; the send's start when not stamped) the
        unsent rest is copied out (checked) and sent as ordinary buffers, every map let go."""
        try:
            self._send(sock, bufs)
        finally:
            for buf in bufs:
                if type(buf) is MappedRecords:
                    buf.release()

    def _send(self, sock, bufs):
        fd = sock.fileno()
        now = self.clock()
        born = [b.born for b in bufs if type(b) is MappedRecords and b.born is not None]
        deadline = min(born, default=now) + self.hold_s  # the maps are let go past it
        head = []
        i, n = 0, len(bufs)
        while i < n:
            buf = bufs[i]
            i += 1
            if type(buf) is not MappedRecords:
                head.append(buf)
                continue
            h = head[0] if len(head) == 1 else b"".join(head)
            head = []
            total = len(h) + buf.nbytes
            pos = 0
            while pos < total:
                if now > deadline:  # held the maps long enough: the rest goes as ordinary buffers
                    self.copied_out += 1
                    rest = [_rest(h, buf, pos)] + [_copy(b) for b in bufs[i:]]  # every map let go now
                    for part in rest:
                        sock.sendall(part)
                    return
                _check(buf, max(0, pos - len(h)))
                try:
                    sent = send_ranges(fd, h, buf.view, buf.ranges, pos)
                except BlockingIOError:
                    sent = 0
                if sent:
                    pos += sent
                    now = self.clock()
                    continue
                self.wait(fd, deadline - now)
                now = self.clock()
                if sock.fileno() != fd:  # closed by another greenlet meanwhile: the number may name another socket
                    raise OSError(errno.EBADF, "the connection was closed during a send")
            buf.release()  # sent: its map is not held for the rest of the send
            self.sent_mapped += 1
        if head:
            sock.sendall(head[0] if len(head) == 1 else b"".join(head))


def _check(records, pos):
    """Raise when a record of ``records`` with bytes from ``pos`` on may have changed since its read (a cut of the
    log reached it: ``MappedRecords.intact``): the connection closes with its reply unfinished rather than send
    bytes that were not checked."""
    if not records.intact(pos):
        raise OSError(errno.EIO, "records of this reply were cut from the log since their read; closing the connection")


def _rest(head, records, pos):
    """The bytes of ``head`` + ``records`` from ``pos`` on, copied (checked first); the records' map let go."""
    _check(records, max(0, pos - len(head)))
    if pos < len(head):
        data = bytes(memoryview(head)[pos:]) + records.joined()
    else:
        data = records.joined(pos - len(head))
    records.release()
    return data


def _copy(buf):
    if type(buf) is MappedRecords:
        return _rest(b"", buf, 0)
    return buf


def _wait_writable(fd, timeout):
    try:
        wait_write(fd, timeout=max(timeout, 0.0))
    except socket.timeout:
        pass
