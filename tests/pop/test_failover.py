"""Per-message acknowledgement across a failover (docs/messaging.md "Per-message acknowledgement (POP)"): a slave
follows the master's %POP% records, and once promoted hands out and takes acknowledgements where the master left
off: no acknowledged message again, no unacknowledged one lost."""

import os
import time

import pytest

from metaq import admincli as admin
from metaq.client.local import free_port, small_config
from metaq.client.pop import SimpleConsumer
from tests.harness.broker import wait_for
from tests.harness.replication import caught_up, master_config

pytestmark = pytest.mark.fault


def url(b):
    return "meta://127.0.0.1:%d" % b.port


def test_a_promoted_slave_keeps_the_pop_state(broker_factory, tmp_path, capsys):
    rport = free_port()
    m = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                       extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    with m.client() as c:
        for p in range(4):
            for i in range(2):
                c.put_ok("tpop", b"%d-%d" % (p, i), p)
    with SimpleConsumer(url(m), "workers", "tpop", invisible_ms=200) as a:
        got = a.receive(6)
        assert len(got) == 6
        acked, unacked = got[:3], got[3:]
        assert a.ack(*acked) == [None] * 3
    caught_up(m, s)
    with s.client() as c:  # the slave learned the master's records
        wait_for(lambda: c.stats_dict()["pop_in_flight"] == "3", what="the slave's pop_in_flight at 3")
    m.kill()
    assert admin.main(["promote", "127.0.0.1:%d" % s.port]) == 0, capsys.readouterr()
    time.sleep(0.25)
    with SimpleConsumer(url(s), "workers", "tpop", invisible_ms=60_000) as a:
        after = wait_for(lambda: a.receive(32), what="messages from the promoted slave")
    seen = {(r.message.partition, r.message.offset): r.attempt for r in after}
    assert not {(r.message.partition, r.message.offset) for r in acked} & set(seen)
    assert all(seen[(r.message.partition, r.message.offset)] == 2 for r in unacked)
    assert len(seen) == 8 - 3
