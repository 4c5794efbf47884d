"""A server-side TLS connection over a plain gevent socket, through memory BIOs (``SSLContext.wrap_bio``).

Why not gevent's ``SSLSocket``: it wraps every TLS record (16 KiB at most) in a Python-level read with its
own wait loop, so a burst of pipelined puts costs one Python round trip, and often one system call, per
record. Here one ``recv`` of the plain socket takes everything the kernel holds (up to ``RECV_BYTES``) into
the incoming BIO, and the records in it are decrypted in a tight loop of ``SSLObject.read`` calls; a reply
is encrypted in one ``SSLObject.write`` (as many records as it needs) and leaves with one ``sendall``. The
SSL object is never touched during socket I/O, and sends hold a lock, so two greenlets that send (a reply
writer, a long poll) can never interleave their records.

It offers what the connection core and the front-ends use of a socket: ``recv``, ``send``, ``sendall``,
``settimeout``, ``fileno``, ``setsockopt``, ``pending``, ``close`` (and ``getpeercert``).
"""

import socket
import ssl
import time
from fcntl import ioctl
from termios import FIONREAD

import gevent
from gevent.lock import Semaphore

__all__ = ["BioTls", "RECV_BYTES"]

#: Bytes asked of one recv() of the plain socket.
RECV_BYTES = 256 * 1024

_NOTHING = b"\0\0\0\0"


class HandshakeTimeout(Exception):
    pass


class BioTls:
    """One TLS connection (see the module doc); ``handshake`` makes it."""

    layered = True  # read and written only through this object, all the socket holds taken at once (connections.py)

    def __init__(self, sock, sslobj, incoming, outgoing):
        self.sock = sock
        self._obj = sslobj
        self._in = incoming
        self._out = outgoing
        self._send_lock = Semaphore()
        self._eof = False
        self._timeout = None  # what settimeout set: the longest a recv waits, over all the plain reads it makes

    @classmethod
    def handshake(cls, context, sock, deadline_s, started):
        """The server side of the handshake on ``sock``, finished ``deadline_s`` after ``started`` (monotonic):
        the connection, or ``HandshakeTimeout`` / ``ssl.SSLError`` / ``OSError``."""
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = context.wrap_bio(incoming, outgoing, server_side=True)
        left = max(0.001, deadline_s - (time.monotonic() - started))
        with gevent.Timeout(left, HandshakeTimeout):
            sock.settimeout(left + 1.0)  # the Timeout above ends it first: one message
            while True:
                try:
                    obj.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    data = outgoing.read()
                    if data:
                        sock.sendall(data)
                    data = sock.recv(RECV_BYTES)
                    if not data:
                        raise ConnectionResetError("closed during the TLS handshake") from None
                    incoming.write(data)
            data = outgoing.read()
            if data:
                sock.sendall(data)
        return cls(sock, obj, incoming, outgoing)

    # -- reading ---------------------------------------------------------------

    def recv(self, nbytes):
        """Up to ``nbytes`` of plaintext: what the records already received hold, else waits for more; b"" at the
        end of the stream. The timeout (``settimeout``) bounds the whole call, not each plain read: a peer that
        trickles a record's bytes in does not restart the wait with each of them (socket.timeout)."""
        out, size = [], 0
        obj = self._obj
        started = None
        while size < nbytes:
            try:
                chunk = obj.read(nbytes - size)
            except ssl.SSLWantReadError:
                if size and not self._arrived():
                    break
                if self._eof:
                    break
                if self._out.pending:  # an alert (a refused renegotiation) the peer waits for
                    self._flush()
                if self._timeout is not None:
                    if started is None:
                        started = time.monotonic()
                    else:  # a record begun, not whole: what is left of the call's time
                        left = self._timeout - (time.monotonic() - started)
                        self.sock.settimeout(max(0.0, left))
                        if left <= 0:
                            raise socket.timeout("timed out") from None
                data = self.sock.recv(RECV_BYTES)
                if not data:
                    self._eof = True
                    self._in.write_eof()
                    continue
                self._in.write(data)
                continue
            except ssl.SSLZeroReturnError:  # the peer's close_notify
                break
            except ssl.SSLEOFError:  # closed without close_notify: the end, as a plaintext close
                break
            if not chunk:
                break
            out.append(chunk)
            size += len(chunk)
        if started is not None:
            self.sock.settimeout(self._timeout)  # (its sends wait as long as before)
        if self._out.pending:  # what reading made the SSL object answer (a TLS 1.3 key update)
            self._flush()
        return out[0] if len(out) == 1 else b"".join(out)

    def _arrived(self):
        """True when the kernel holds more bytes of this connection (read without waiting)."""
        try:
            return ioctl(self.sock.fileno(), FIONREAD, _NOTHING) != _NOTHING
        except OSError:
            return False

    def pending(self):
        """Bytes received and not yet returned by ``recv`` (decrypted or still in records)."""
        return self._obj.pending() + self._in.pending

    # -- writing ---------------------------------------------------------------

    def sendall(self, data):
        with self._send_lock:
            self._obj.write(data)
            self.sock.sendall(self._out.read())

    def send(self, data):
        self.sendall(data)
        return len(data)

    def _flush(self):
        with self._send_lock:
            data = self._out.read()
            if data:
                self.sock.sendall(data)

    # -- the rest ----------------------------------------------------------------

    def settimeout(self, timeout):
        self._timeout = timeout
        self.sock.settimeout(timeout)

    def fileno(self):
        return self.sock.fileno()

    def setsockopt(self, *args):
        self.sock.setsockopt(*args)

    def getpeercert(self, binary_form=False):
        return self._obj.getpeercert(binary_form)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def is_timeout(exc):
    return isinstance(exc, (socket.timeout, HandshakeTimeout))
