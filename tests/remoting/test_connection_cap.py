"""One connection cap across every listener (serving/connections.py): the text and remoting ports share it."""

import socket
import time

from metaq.protocol import events as ev
from metaq.protocol.stream import CLOSED


def remoting_socket(broker):
    return socket.create_connection(("127.0.0.1", broker.config["remoting"]["port"]), timeout=5)


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def test_the_cap_counts_both_ports_and_refuses_one_past_it_on_either(rmq_factory):
    broker = rmq_factory(limits={"max_connections": 4, "max_connections_per_address": 4})
    texts = [broker.client() for _ in range(3)]
    remote = remoting_socket(broker)
    try:
        for i, c in enumerate(texts):
            assert c.call(ev.Version(i)).code == 200
        assert wait_for(lambda: texts[0].stats_dict()["remoting_connections"] == "1")
        # at the cap (3 text + 1 remoting): one more on the remoting port is closed at once ...
        extra = remoting_socket(broker)
        extra.settimeout(5)
        assert extra.recv(100) == b""
        extra.close()
        # ... and one more on the text port gets the text port's refusal
        refused = broker.client()
        r = refused.read_event()
        assert r.code == 503 and b"too many connections: the limit is 4" in r.body
        assert refused.read_event() is CLOSED
        refused.close()
        # a remoting connection that goes frees a place for a text one
        remote.close()
        remote = None
        assert wait_for(lambda: texts[0].stats_dict()["remoting_connections"] == "0")
        with broker.client() as again:
            assert again.call(ev.Version(9)).code == 200
        assert "refused a connection from 127.0.0.1 on the remoting port" in broker.log_text()
        assert "refused a connection from 127.0.0.1 on the text port" in broker.log_text()
    finally:
        for c in texts:
            c.close()
        if remote is not None:
            remote.close()
