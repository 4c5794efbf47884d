"""A put whose client waits for its ack alone is answered by the flush round that makes it durable
(text/connection.py ``_defer``, ``Flusher.on_flushed``): its connection reads on meanwhile, so whatever the
client sends before the ack must still be answered after it, and nothing is acknowledged before its fsync."""

import time

from metaq.client.local import small_config
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.text import serialize


def test_a_request_sent_while_a_put_waits_for_its_flush_is_answered_after_the_put(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "data", store={"flush": "sync"}))
    with b.client() as c:
        offsets = []
        for k in range(300):
            body = b"m-%d" % k
            c.send(serialize(ev.Put("t-defer", 0, 0, body, 2 * k + 1, metaq_checksum(body))))
            time.sleep(0.0002 * (k % 5))  # sometimes before the put is handled, mostly while its fsync runs
            c.send(serialize(ev.Version(2 * k + 2)))
            first, second = c.read_event(), c.read_event()
            assert (first.code, first.opaque) == (200, 2 * k + 1), (k, first, second)  # the put's ack first
            assert (second.code, second.opaque) == (200, 2 * k + 2), (k, first, second)
            offsets.append(int(first.body.split()[2]))
        assert offsets == list(range(300))
        assert [r.data for r in c.get_records("t-defer", 0, 0, max_size=1 << 20)] == [b"m-%d" % k for k in range(300)]
