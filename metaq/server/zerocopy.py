"""Zero-copy sends: a get's checked records go from the segment maps to the socket, with no copy of ours.

A reply read with ``MessageStore.read_joined(..., mapped=True)`` holds ``store.gather.MappedRecords``: its records
were checked in place (CRC included) and stay in the maps. ``send_buffers`` sends a list of replies' buffers
(``bytes`` and ``MappedRecords``) in order: each run of plain buffers before a ``MappedRecords`` is joined into the
head of its ``sendmsg`` (``send_ranges``, in C: one iovec per record, the GIL released during the call), so the
kernel copies the records straight from the page cache's mapped pages into the socket.

The socket is non-blocking (gevent): a call that cannot send everything sends what the socket takes and the rest
goes when it is writable again. The loop ran meanwhile: if the log was cut since the records were read (a slave
cutting its log rewrites bytes in place: ``CommitLog.cuts``), the unsent ones are checked again first, and one
that no longer passes closes the connection, its reply unfinished, rather than be sent. While it waits, the reply holds its maps (a segment retention deleted keeps its
disk space until then): a send that has waited ``limits.MAX_PINNED_SEND_S`` since the socket first refused bytes
copies what it has not sent yet of every ``MappedRecords`` it holds (the bytes checked when they were read) into
ordinary buffers, lets the maps go and finishes through the socket's ``sendall`` like any reply. A slow reader
therefore pins maps for at most that long per send; the bytes it holds are bounded by its reply budget as before.

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
    for a, b in zip(r[::2], r[1::2]):
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

    ``hold_s``: how long a send may wait on a full socket while it holds maps before copying the rest out;
    ``clock`` and ``wait(fd, timeout)`` (wait for the socket to be writable; a timeout just returns) are
    given for tests."""

    def __init__(self, hold_s=limits.MAX_PINNED_SEND_S, clock=time.monotonic, wait=None):
        self.hold_s = hold_s
        self.clock = clock
        self.wait = wait or _wait_writable
        self.copied_out = 0  # sends that passed hold_s and copied their rest (tests, logs)

    def send(self, sock, bufs):
        """Send every buffer of ``bufs`` in order; raises OSError / socket.timeout as ``sendall`` does."""
        fd = sock.fileno()
        deadline = None  # set at the first wait: the maps are let go past it
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
            if deadline is not None:  # this send waited: the loop ran since these were checked
                _check(buf, 0)
            total = len(h) + buf.nbytes
            pos = 0
            while pos < total:
                try:
                    sent = send_ranges(fd, h, buf.view, buf.ranges, pos)
                except BlockingIOError:
                    sent = 0
                if sent:
                    pos += sent
                    continue
                now = self.clock()
                if deadline is None:
                    deadline = now + self.hold_s
                if now > deadline:  # held the maps long enough: the rest goes as ordinary buffers
                    self.copied_out += 1
                    rest = [_rest(h, buf, pos)] + [_copy(b) for b in bufs[i:]]  # every map let go now
                    for part in rest:
                        sock.sendall(part)
                    return
                self.wait(fd, deadline - now)
                if sock.fileno() != fd:  # closed by another greenlet meanwhile: the number may name another socket
                    raise OSError(errno.EBADF, "the connection was closed during a send")
                _check(buf, max(0, pos - len(h)))
        if head:
            sock.sendall(head[0] if len(head) == 1 else b"".join(head))


def _check(records, pos):
    """Raise when a record of ``records`` with bytes from ``pos`` on no longer passes its check (the loop ran since
    it was read): the connection closes with its reply unfinished rather than send unchecked bytes."""
    if not records.intact(pos):
        raise OSError(errno.EIO, "records changed in the log during their send; closing the connection")


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
