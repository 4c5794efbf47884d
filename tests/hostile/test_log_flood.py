"""A client that makes the broker log a line per connection cannot fill the disk with them."""

import socket

from metaq.client.local import small_config
from metaq.protocol import events as ev
from tests.harness.broker import wait_for


def test_two_thousand_bad_connections_write_a_bounded_log(broker_factory, tmp_path):
    broker = broker_factory(small_config(tmp_path / "data"))
    before = len(broker.log_text())
    for _ in range(2000):
        s = socket.create_connection(("127.0.0.1", broker.port))
        s.sendall(b"x" * 3000 + b"\r\n")  # a line past max_line_bytes: 400, then the broker closes
        s.settimeout(5)
        try:
            while s.recv(4096):
                pass
        except OSError:
            pass
        s.close()
    with broker.client() as c:
        assert c.call(ev.Version(1)).code == 200
        wait_for(lambda: int(c.stats_dict()["protocol_errors"]) >= 2000, what="every bad line counted")
    logged = broker.log_text()[before:]
    lines = [ln for ln in logged.splitlines() if "; closing" in ln]
    assert 1 <= len(lines) <= 100, "%d lines for 2,000 bad connections" % len(lines)
    assert len(logged) < 100 * 300
