"""A scripted fake broker on 127.0.0.1 that speaks the text protocol, for the client's error paths."""

import socket
import threading

from metaq.protocol import stats as stats_codec
from metaq.protocol import events as ev
from metaq.transactions import wire
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.protocol.text import TextParser, serialize
from metaq import textcommands  # noqa: F401 - every text command declared (the whole table)

HANG = object()  # FakeBroker handler: never answer
CLOSE = object()  # FakeBroker handler: close the connection


class FakeBroker:
    """A scripted stand-in that speaks the text protocol, for the client's error-path parsing only.

    ``handler(event)`` returns the reply (an event), None (use the default: 200
    with an empty body; stats describe broker ``broker_id`` with 2 partitions
    per topic; END gets no reply), HANG or CLOSE. Every request is in ``requests``.
    """

    def __init__(self, handler=lambda event: None, broker_id=3):
        self.handler = handler
        self.broker_id = broker_id
        self.requests = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.url = "meta://127.0.0.1:%d" % self.server.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def types(self):
        """The ``transaction`` types received, in order."""
        return [e.tx_type for e in self.requests if isinstance(e, ev.Transaction)]

    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        parser = TextParser(max_body=8 << 20)
        conn.settimeout(0.2)
        with conn:
            while not self._stop.is_set():
                event = parser.next_event()
                if event is CLOSED:
                    return
                if event is NEED_DATA:
                    try:
                        parser.receive_data(conn.recv(65536))
                    except socket.timeout:
                        pass
                    except OSError:
                        return
                    continue
                self.requests.append(event)
                reply = self.handler(event)
                if reply is None:
                    reply = self._default(event)
                if reply is CLOSE:
                    return
                if reply is not HANG and reply is not None:
                    conn.sendall(serialize(reply._replace(opaque=event.opaque)))

    def _default(self, event):
        if isinstance(event, ev.Stats):
            if not event.item:
                return ev.Result(200, stats_codec.encode_summary([("broker_id", self.broker_id)]), 0)
            null = {name: "null" for name in stats_codec.REALTIME}
            return ev.Result(200, stats_codec.encode_topic(stats_codec.TopicFigures(event.item, 0, 2, 0, 0, null)), 0)
        if isinstance(event, ev.Transaction) and event.tx_type == "END":
            return None
        if isinstance(event, ev.Transaction) and event.tx_type == "PREPARE":
            return ev.Result(200, b"0", 0)
        if isinstance(event, ev.Put):
            return ev.Result(200, b"-1 %d -1" % max(event.partition, 0), 0)
        return ev.Result(200, b"", 0)

    def close(self):
        self._stop.set()
        self.server.close()
        self._thread.join(5)


def xa_reply(code, msg="from the fake broker"):
    return ev.Result(500, wire.xa_error_body(code, msg), 0)
