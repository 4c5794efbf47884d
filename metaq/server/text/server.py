"""The text port: a listener on the connection core whose connections speak MetaQ's text protocol."""

from metaq.protocol.httpline import http_url
from metaq.protocol.text import encode_result
from metaq.server import zerocopy
from metaq.server.text.connection import Connection
from metaq.server.zerocopy import ZeroCopySender


class TextFrontEnd:
    """What every text connection shares: the dispatcher, the put-burst fast path, the flusher, stats, limits."""

    def __init__(self, core, dispatcher, fast_puts, flusher, stats, limits_cfg, zero_copy=False, http=None):
        self.core = core
        #: The broker's HTTP port as ``(scheme, host, port)``, or None: named to an HTTP client that reached this port.
        self.http = http
        #: Plaintext gets send their records from the maps (server/zerocopy.py), when the C helper is built.
        self.zero_copy = ZeroCopySender() if zero_copy and zerocopy.AVAILABLE else None
        self.dispatcher = dispatcher
        self.guard = dispatcher.guard
        self.fast_puts = fast_puts
        self.flusher = flusher
        self.stats = stats
        self.rules = core.rules
        self.max_line_bytes = limits_cfg.max_line_bytes
        self.max_body_bytes = limits_cfg.max_body_bytes
        self.listener = None

    @property
    def closing(self):
        """True once the broker shuts down: a connection ends after the requests it has."""
        return self.core.closing

    @property
    def port(self):
        return self.listener.port if self.listener is not None else None

    def listen(self, host, port):
        self.listener = self.core.listen("text", host, port, self._connection, refuse=refuse)
        return self.listener

    def http_refusal(self, local_host):
        """What an HTTP request on this port is told: the HTTP port's URL (a wildcard bind named by ``local_host``,
        the address the client reached), or that the broker has none."""
        if self.http is None:
            return ("this is metaq's text protocol port, not HTTP; this broker's HTTP port is off (set http.port in "
                    "its configuration, or --http-port)")
        scheme, host, port = self.http
        return "this is metaq's text protocol port, not HTTP: the HTTP port is %s" % http_url(
            scheme, local_host if host in ("0.0.0.0", "::") else host, port)

    def _connection(self, sock, address, conn_id):
        return Connection(sock, address, conn_id, self)

    def connection_count(self):
        return self.core.count("text")

    def zero_copy_values(self):
        """The summary's zero-copy pairs: records sent from the maps (per segment of a reply), sends that held them
        ``limits.MAX_PINNED_SEND_S`` and copied their rest, replies copied before a wait (behind another send or a
        flush); off: the path is not taken (turned off, or the C helper not built)."""
        z = self.zero_copy
        if z is None:
            return [("zero_copy_reads", "off")]
        return [("zero_copy_reads", "on"), ("zero_copy_sent", z.sent_mapped), ("zero_copy_copied_out", z.copied_out),
                ("zero_copy_unpinned", z.unpinned)]


def refuse(sock, reason, code=503):
    """The text port's refusal of a connection (past the cap: ``result 503``; plaintext on a port that requires
    TLS: ``result 400``) with the reason, in plaintext (then closed)."""
    sock.sendall(encode_result(code, reason.encode(), 0))
