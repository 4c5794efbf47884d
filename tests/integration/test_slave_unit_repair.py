"""A slave whose index units stopped naming their records rebuilds them from its log before it copies on (issue 53
point 9), on real brokers.

A lost write leaves the first page of an index file empty; the slave then answered 512 (corrupt record, commit-log
position 0) for records intact in its log, and so would it once promoted. Here the page is zeroed in the running
slave's file (its map sees it: one page cache), the slave's get answers 512, the master restarts, and the slave,
before it copies on, rebuilds those units from its log: it then reads as its master at every offset.
"""

import os

import pytest

from metaq.protocol import events as ev
from metaq.store.index import UNIT_SIZE
from tests.harness.broker import consume_all, wait_for
from tests.harness.replication import caught_up, stats
from tests.integration.test_replication import start_pair

pytestmark = pytest.mark.fault  # a file damaged, the master restarted

TOPIC, PARTITION, COUNT, UNITS = "t-a", 0, 3000, 1024


def test_a_slave_rebuilds_units_that_do_not_name_their_records_before_it_copies_on(broker_factory, tmp_path):
    master, (slave,), _rport = start_pair(broker_factory, tmp_path, flush="async", index_file_units=UNITS)
    with master.client(timeout=30) as c:
        for i in range(COUNT):
            c.put_ok(TOPIC, b"m%05d-" % i + b"x" * (i % 50), PARTITION)
            c.put_ok(TOPIC, b"other-%d" % i, 1)
    caught_up(master, slave)
    path = os.path.join(slave.data_dir, "index", TOPIC, str(PARTITION), "%020d" % (UNITS * UNIT_SIZE))
    with open(path, "r+b") as f:  # the first page of the second index file: units 1024..1279
        f.write(bytes(4096))
    with slave.client() as c:
        r = c.get(TOPIC, PARTITION, UNITS, 1 << 20)
        assert isinstance(r, ev.Result) and r.code == 512, r
        assert "offset %d" % UNITS in r.body.decode() and "(commit-log position 0)" in r.body.decode()
    master.stop()
    wait_for(lambda: stats(slave)["replication_link"] == "down", 15, "the slave sees the link down")
    master.start()
    wait_for(lambda: stats(slave)["replication_link"] == "connected", 15, "the slave reconnects")
    assert "index units 1024..1279 of t-a-0 did not name their records: 256 rebuilt" in slave.log_text()
    with master.client() as mc, slave.client() as sc:
        assert consume_all(sc, TOPIC, PARTITION) == consume_all(mc, TOPIC, PARTITION)
        assert len(consume_all(sc, TOPIC, PARTITION)) == COUNT
