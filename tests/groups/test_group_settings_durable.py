"""Per-group settings survive (docs/concepts.md "Per-group settings"): a restart reads them back from the data
directory, a slave takes its master's table and, promoted, refuses what the master refused; only an admin changes
them."""

import json
import os

import pytest

from metaq import admincli as admin
from metaq.client.local import free_port, small_config
from metaq.groups.wire import GroupSettingsCommand
from metaq.protocol import events as ev
from tests.harness.acl import login, secured_config
from tests.harness.broker import wait_for
from tests.harness.replication import caught_up, master_config


def url(b):
    return "meta://127.0.0.1:%d" % b.port


def shown(b, group):
    with b.client() as c:
        r = c.call(GroupSettingsCommand("show", group, (), c.opaque()))
        assert r.code == 200, r
        return json.loads(r.body)


@pytest.mark.fault
def test_settings_survive_a_restart_and_a_slave_promotion(broker_factory, tmp_path, capsys):
    rport = free_port()
    m = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                       extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    with m.client() as c:
        c.put_ok("gsd", b"one", 0)
    assert admin.main(["--brokers", url(m), "group-settings", "set", "frozen", "--consumption-enabled", "false",
                       "--max-retries", "4"]) == 0
    m.stop()
    m.start()  # a restart: read back from the data directory
    assert (shown(m, "frozen")["consumption_enabled"], shown(m, "frozen")["max_retries"]) == (False, 4)
    with m.client() as c:
        assert c.get("gsd", 0, 0, group="frozen").code == 403
    caught_up(m, s)
    wait_for(lambda: shown(s, "frozen")["max_retries"] == 4, what="the slave's copy of the group settings")
    assert admin.main(["--brokers", url(s), "group-settings", "set", "other", "--max-retries", "1"]) == 3  # a slave
    assert "changed on the master" in capsys.readouterr().err
    m.kill()
    assert admin.main(["promote", "127.0.0.1:%d" % s.port]) == 0, capsys.readouterr()
    with s.client() as c:
        wait_for(lambda: c.get("gsd", 0, 0, group="frozen").code == 403, what="the promoted slave refusing frozen")
        assert isinstance(c.get("gsd", 0, 0, group="others"), ev.Value)
    assert admin.main(["--brokers", url(s), "group-settings", "delete", "frozen"]) == 0  # the new master's own
    with s.client() as c:
        assert isinstance(c.get("gsd", 0, 0, group="frozen"), ev.Value)


def test_only_an_admin_changes_settings_and_any_user_reads_them(broker_factory, tmp_path):
    b = broker_factory(secured_config(tmp_path))
    alice, root = login(b, "alice"), login(b, "admin")
    try:
        r = alice.call(GroupSettingsCommand("set", "billing", (("consumption_enabled", "0"),), alice.opaque()))
        assert r.code == 403
        r = alice.call(GroupSettingsCommand("delete", "billing", (), alice.opaque()))
        assert r.code == 403
        assert json.loads(alice.call(GroupSettingsCommand("show", "billing", (), 1)).body)["default"] is True
        r = root.call(GroupSettingsCommand("set", "billing", (("consumption_enabled", "0"),), root.opaque()))
        assert r.code == 200
        r = alice.call(ev.Get("orders", "billing", 0, 0, 1024, alice.opaque(), None))
        assert r.code == 403 and b"billing" in r.body
        assert [g["group"] for g in json.loads(alice.call(GroupSettingsCommand("list", None, (), 2)).body)] == \
            ["billing"]
    finally:
        alice.close()
        root.close()
