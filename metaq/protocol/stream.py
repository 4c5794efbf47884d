"""The buffer handling our sans-IO frame parsers share, and the markers every parser returns.

``StreamParser`` is the base of ``metaq.protocol.text.TextParser`` and
``metaq.protocol.rocketmq.remoting.RemotingParser``. ``NEED_DATA`` (feed more
bytes) and ``CLOSED`` (the peer closed the stream cleanly between frames) are
returned by their ``next_event()`` and by
``metaq.protocol.replication.ReplicationParser``'s: one pair of markers for
every parser, compared with ``is``.
"""

from metaq.errors import RemoteProtocolError

__all__ = ["NEED_DATA", "CLOSED", "StreamParser"]


class _Sentinel:
    """A named marker returned by a parser's ``next_event`` (``NEED_DATA``, ``CLOSED``)."""

    __slots__ = ("_name",)

    def __init__(self, name):
        self._name = name

    def __repr__(self):
        return self._name


#: ``next_event()``: no whole frame is buffered yet; feed more bytes.
NEED_DATA = _Sentinel("NEED_DATA")
#: ``next_event()``: the peer closed the stream cleanly between frames.
CLOSED = _Sentinel("CLOSED")


class StreamParser:
    """The buffer handling our sans-IO frame parsers share (text, remoting).

    ``receive_data`` appends bytes (``b""`` marks the end of the stream; bytes
    after it are a fatal error); ``next_event`` runs the subclass's
    ``_next_event`` and keeps a fatal ``RemoteProtocolError`` sticky, so every
    later call raises it again. ``_pos`` is the start of the unparsed bytes in
    ``_buf``; consumed bytes are dropped when more arrive (``_compact``).
    """

    #: In slots (a broker holds a parser per connection, and the C helper reads these at their offsets); a subclass
    #: adds its own ``__slots__`` to keep that, or gets a dict for its attributes.
    __slots__ = ("_buf", "_pos", "_completed", "_eof", "_fatal")

    def __init__(self):
        self._buf = bytearray()
        self._pos = 0
        self._completed = 0  # frames returned as events or answered with a (non-fatal) error
        self._eof = False
        self._fatal = None

    @property
    def buffered(self):
        """Number of received bytes not yet returned as events."""
        return len(self._buf) - self._pos

    def receive_data(self, data):
        """Append received bytes; ``b""`` marks the end of the stream."""
        if self._fatal is not None:
            return
        if not data:
            self._eof = True
            return
        if self._eof:
            self._fatal = RemoteProtocolError("data received after the end of the stream", 0, True)
            raise self._fatal
        if self._pos:
            self._compact()
        self._accept(data)

    @property
    def completed(self):
        """How many frames have completed so far (events returned, frames refused with a non-fatal error):
        a server restarts a request's deadline when this grows."""
        return self._completed

    def _compact(self):
        del self._buf[: self._pos]
        self._pos = 0

    def _accept(self, data):
        self._buf += data

    def next_event(self):
        """Return the next event, ``NEED_DATA`` or ``CLOSED``; raise RemoteProtocolError on a bad frame."""
        if self._fatal is not None:
            raise self._fatal
        try:
            event = self._next_event()
        except RemoteProtocolError as exc:
            if exc.fatal:
                self._fatal = exc
            else:
                self._completed += 1
            raise
        if event is not NEED_DATA and event is not CLOSED:
            self._completed += 1
        return event

    def _next_event(self):
        raise NotImplementedError

    @property
    def in_frame(self):
        """True while part of a frame is buffered (a server's request deadline runs)."""
        return self._pos < len(self._buf)

    def _need_data(self):
        """What ``_next_event`` returns when the buffer holds no whole frame: ``NEED_DATA`` until the end of the
        stream, then ``CLOSED`` between frames; a stream that ended inside a frame raises ``_ended_inside``'s
        error."""
        if not self._eof:
            return NEED_DATA
        if not self.in_frame:
            return CLOSED
        raise self._ended_inside()

    def _ended_inside(self):
        return RemoteProtocolError("connection closed inside a frame", 0, True)
