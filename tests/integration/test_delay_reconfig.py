"""README "Delayed delivery": a message's delivery time is fixed when it is stored. A broker restarted with fewer
`delay.levels` still delivers a pending entry of a level that no longer exists, at its time (never before); one
restarted with a narrower `topics` list drops a pending message whose topic it no longer accepts, with an ERROR
line and `stats delay` `dropped`."""

import time

from metaq.client.local import small_config
from metaq.protocol import events as ev
from tests.harness.broker import wait_for
from tests.harness.delay import delay_stats, put_delayed_ok, records

DUE_S = 6  # level 3 of the first configuration


def test_a_restart_with_fewer_levels_and_narrower_topics_keeps_the_time_and_drops_the_unaccepted(
        broker_factory, tmp_path):
    wd = tmp_path / "b"
    b = broker_factory(small_config(wd / "data", delay={"levels": "1s 2s %ds" % DUE_S}), workdir=wd)
    with b.client() as c:
        t0 = time.monotonic()
        kept_id, _ = put_delayed_ok(c, "t-later", b"kept", 3, partition=0)  # level 3: no longer exists
        put_delayed_ok(c, "orders", b"dropped", 3, partition=0)  # "orders": no longer accepted
        assert delay_stats(c)[0][3]["pending"] == "2"
    assert b.stop() == 0
    b.config["delay"] = {"levels": "1s 2s"}
    b.config["topics"] = [{"name": "t*", "partitions": 4}]
    b.start()
    with b.client() as c:
        assert c.get("t-later", 0, 0).code == 404 or time.monotonic() - t0 >= DUE_S  # not before its time
        while True:  # a long poll wakes when it is delivered
            v = c.get("t-later", 0, 0, max_wait_ms=2000)
            if isinstance(v, ev.Value) or time.monotonic() - t0 > DUE_S + 30:
                break
        delivered_after = time.monotonic() - t0
        assert isinstance(v, ev.Value), v
        assert delivered_after >= DUE_S - 0.1, delivered_after  # at its original time, not earlier
        [rec] = records(c, "t-later", [0])
        assert (rec.msg_id, rec.payload) == (kept_id, b"kept")
        wait_for(lambda: delay_stats(c)[1]["dropped"] == 1, what="the message to orders dropped")
    log = b.log_text(since_start=True)
    errors = [line for line in log.splitlines() if " ERROR " in line and "dropped message" in line]
    assert len(errors) == 1 and "for orders-0" in errors[0] and "does not accept topic orders" in errors[0], errors
