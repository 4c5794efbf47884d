"""The key index on a slave: keys the master stored are found on the slave once it is promoted (README "Key
index": a slave indexes the master's log as it flushes it, at the same positions)."""

import os

import pytest

from metaq import admincli as admin
from metaq.client import keys
from metaq.client.local import free_port, small_config
from tests.harness.replication import caught_up, master_config
from tests.integration.test_key_lookup import Conn, eventually, put_keyed

pytestmark = pytest.mark.fault


def test_keys_are_found_on_a_promoted_slave(broker_factory, tmp_path, capsys):
    rport = free_port()
    m = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                       extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    with m.client() as c:
        for i in range(300):
            put_keyed(c, "tP", b"%d" % i, "order-%d all" % (i % 10), partition=0)
    caught_up(m, s)
    m.kill()
    assert admin.main(["promote", "127.0.0.1:%d" % s.port]) == 0, capsys.readouterr()
    with s.client() as c:
        got = eventually(lambda: list(keys.lookup(Conn(c), "tP", "order-3")))
        assert sorted(int(x.body) for x in got) == list(range(3, 300, 10))
        assert len(list(keys.lookup(Conn(c), "tP", "all"))) == 300
        put_keyed(c, "tP", b"after", "order-3")  # the promoted broker indexes its own puts too
        assert eventually(lambda: len(list(keys.lookup(Conn(c), "tP", "order-3"))) == 31)
