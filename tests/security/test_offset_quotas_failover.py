"""The consumer_offsets quota across a failover (docs/security.md "Quotas"): each committed offset's owner goes to
the slave with the entry (the OFFSETS frame's owners), so the slave counts the same entries per user as its
master, and once promoted it holds each user to its quota. Real brokers with authentication on and a replication
secret; the slave promoted by hand (``metaq-admin promote``)."""

import pytest

from metaq import admincli as admin
from metaq.client.local import free_port, small_config
from metaq.protocol import events as ev
from metaq.protocol import stats as stats_codec
from metaq.protocol.checksum import metaq_checksum
from tests.harness.acl import SECRETS, login, write_acl
from tests.harness.broker import wait_for
from tests.harness.replication import master_config

pytestmark = pytest.mark.integration

REPLICATION_SECRET = "replication-secret-0123456789abcdef"
QUOTA = 2


def used(broker):
    """``{user: (entries held, quota)}`` of ``consumer_offsets`` from ``stats quotas`` (an admin's)."""
    with login(broker, "admin") as admin_conn:
        rows = stats_codec.parse_quotas(admin_conn.stats("quotas").encode())
    return {r.user: (r.used, r.limit) for r in rows if r.quota == "consumer_offsets"}


def stats(broker):
    with login(broker, "admin") as c:
        return c.stats_dict()


def commit(broker, user, group, topic, partition):
    with login(broker, user) as c:
        return c.call(ev.CommitOffset(group, topic, partition, 1, c.opaque()))


def test_a_promoted_slave_holds_each_user_to_its_consumer_offsets_quota(broker_factory, tmp_path, capsys):
    acl = write_acl(tmp_path / "acl.yaml", quotas={"consumer_offsets": QUOTA})
    security = {"acl_file": acl, "replication_secret": REPLICATION_SECRET}
    rport = free_port()
    mcfg = master_config(tmp_path / "m", rport)
    mcfg["security"] = security
    master = broker_factory(mcfg, workdir=tmp_path / "m")
    slave = broker_factory(small_config(str(tmp_path / "s" / "data"), security=security), workdir=tmp_path / "s",
                           extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    with login(master, "admin") as c:
        for topic, p in (("orders", 0), ("orders", 1), ("orders-b", 0)):
            assert c.call(ev.Put(topic, p, 0, b"x", p + 1, metaq_checksum(b"x"))).code == 200
    wait_for(lambda: stats(slave)["replication_caught_up"] == "true", 20, "the slave caught up")

    assert [commit(master, "alice", "billing", "orders", p).code for p in (0, 1)] == [200, 200]  # at the quota
    r = commit(master, "alice", "billing", "orders-b", 0)  # one past, on the master
    assert r.code == 400 and b"quota consumer_offsets of user alice is %d" % QUOTA in r.body, r
    assert commit(master, "reader", "audit", "orders-b", 0).code == 200
    expected = used(master)
    assert expected["alice"] == (QUOTA, QUOTA) and expected["reader"] == (1, QUOTA)
    wait_for(lambda: used(slave) == expected, timeout=20,
             what=lambda: "the slave's consumer_offsets per user %s, the master's %s" % (used(slave), expected))

    master.stop()
    wait_for(lambda: stats(slave)["replication_link"] == "down", 10, "the slave sees its master gone")
    secret = tmp_path / "admin.secret"
    secret.write_text(SECRETS["admin"])
    secret.chmod(0o600)
    code = admin.main(["--user", "admin", "--secret-file", str(secret), "promote", "127.0.0.1:%d" % slave.port])
    out = capsys.readouterr().out
    assert code == admin.EXIT_OK, out
    wait_for(lambda: stats(slave)["replication_role"] == "master", 10,
             lambda: "the slave promoted: %s" % stats(slave)["replication_role"])

    assert used(slave) == expected  # the owners it copied, not the first user to commit each entry again
    assert commit(slave, "alice", "billing", "orders", 0).code == 200  # an entry alice holds: moved
    r = commit(slave, "alice", "billing", "orders-b", 0)  # one past her quota, on the new master
    assert r.code == 400 and b"quota consumer_offsets of user alice is %d" % QUOTA in r.body, r
    assert commit(slave, "reader", "audit", "orders", 1).code == 200  # another user: served (at its quota)
    assert used(slave)["alice"] == (QUOTA, QUOTA) and used(slave)["reader"] == (QUOTA, QUOTA)
