"""The topics and partitions quotas across a failover (docs/security.md "Quotas"): the owner of each topic a user's
put created goes to the slave with the topic table (the TOPICS frame's owners), so the slave counts the same topics
and partitions per user as its master, keeps them across its restart, and once promoted it holds each user to
its quota. Real brokers with authentication on and a replication secret; the slave promoted by hand
(``metaq-admin promote``)."""

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
QUOTA = 2  # topics per user (each of 2 partitions here: the "*" pattern)


def used(broker):
    """``{(quota, user): (held, quota)}`` of ``topics`` and ``partitions`` from ``stats quotas`` (an admin's)."""
    with login(broker, "admin") as admin_conn:
        rows = stats_codec.parse_quotas(admin_conn.stats("quotas").encode())
    return {(r.quota, r.user): (r.used, r.limit) for r in rows if r.quota in ("topics", "partitions")}


def stats(broker):
    with login(broker, "admin") as c:
        return c.stats_dict()


def put(broker, user, topic):
    with login(broker, user) as c:
        return c.call(ev.Put(topic, 0, 0, b"x", c.opaque(), metaq_checksum(b"x")))


def test_a_promoted_slave_holds_each_user_to_its_topics_quota(broker_factory, tmp_path, capsys):
    acl = write_acl(tmp_path / "acl.yaml", quotas={"topics": QUOTA})
    security = {"acl_file": acl, "replication_secret": REPLICATION_SECRET}
    rport = free_port()
    mcfg = master_config(tmp_path / "m", rport)
    mcfg["security"] = security
    master = broker_factory(mcfg, workdir=tmp_path / "m")
    slave = broker_factory(small_config(str(tmp_path / "s" / "data"), security=security), workdir=tmp_path / "s",
                           extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])

    assert [put(master, "alice", t).code for t in ("orders-a", "orders-b")] == [200, 200]  # at her quota
    r = put(master, "alice", "orders-x")  # one past, on the master
    assert r.code == 400 and b"quota topics of user alice is %d" % QUOTA in r.body, r
    expected = used(master)
    assert expected[("topics", "alice")] == (QUOTA, QUOTA) and expected[("partitions", "alice")][0] == 2 * QUOTA
    wait_for(lambda: used(slave) == expected, timeout=20,
             what=lambda: "the slave's topics and partitions per user %s, the master's %s" % (used(slave), expected))

    master.stop()
    slave.stop()
    slave.start()  # its master gone: what it counts now is what it saved (its topic_owners file)
    assert used(slave) == expected
    wait_for(lambda: stats(slave)["replication_link"] == "down", 10, "the slave sees its master gone")
    secret = tmp_path / "admin.secret"
    secret.write_text(SECRETS["admin"])
    secret.chmod(0o600)
    # restarted without its master it cannot know how far behind it is: --force (it had caught up before)
    code = admin.main(["--user", "admin", "--secret-file", str(secret), "promote", "--force",
                       "127.0.0.1:%d" % slave.port])
    out = capsys.readouterr().out
    assert code == admin.EXIT_OK, out
    wait_for(lambda: stats(slave)["replication_role"] == "master", 10,
             lambda: "the slave promoted: %s" % stats(slave)["replication_role"])

    assert used(slave) == expected  # the owners it copied, not topics no one created
    assert put(slave, "alice", "orders-a").code == 200  # a topic she created: puts go on
    r = put(slave, "alice", "orders-x")  # one more topic: past her quota, on the new master
    assert r.code == 400 and b"quota topics of user alice is %d" % QUOTA in r.body, r
    assert put(slave, "bob", "orders").code == 200  # another user's creation: served
    after = used(slave)
    assert after[("topics", "alice")] == (QUOTA, QUOTA) and after[("topics", "bob")] == (1, QUOTA)
