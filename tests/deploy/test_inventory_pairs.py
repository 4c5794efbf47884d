"""Replication groups in the inventory: a master and its slaves rendered as pairs, and every refusal."""

import re

import pytest
import yaml

from metaq.deploy.groups import start_waves, stop_waves
from metaq.deploy.hostops import STATUS_COLUMNS, status_note, status_row
from metaq.deploy.inventory import InventoryError, parse_inventory
from tests.harness.fab import REPO, run_fab


SECRET_FILE = "/etc/metaq/replication.secret"
#: Non-loopback brokers need authentication and, when they replicate, a replication secret (protected mode).
SECURED = {"server": {"security": {"acl_file": "/etc/metaq/acl.yaml", "replication_secret_file": SECRET_FILE}}}


def inventory(*brokers, **defaults):
    return yaml.safe_dump({"cluster": "orders", "defaults": dict(SECURED, **defaults), "brokers": list(brokers)})


def problems(text):
    with pytest.raises(InventoryError) as info:
        parse_inventory(text, "cluster.yaml")
    return str(info.value)


def config(broker):
    return yaml.safe_load(broker.config_text)


M0 = {"name": "m0", "host": "10.0.0.11", "broker_id": 0}
S1 = {"name": "s1", "host": "10.0.0.21", "role": "slave", "master": "m0"}
S2 = {"name": "s2", "host": "10.0.0.22", "role": "slave", "master": "m0", "port": 9000}


def test_a_manual_pair_renders_master_and_slaves():
    cluster = parse_inventory(inventory(
        {"name": "lone", "host": "10.0.0.9", "broker_id": 5}, S2, M0, dict(S1, slave_id=1)))
    lone, s2, m0, s1 = cluster.brokers
    assert "replication" not in config(lone), "a master without slaves opens no replication port"
    assert config(m0)["replication"] == {"port": 8124, "mode": "async"}
    # s1 asked for id 1; s2 (first in the file) gets the lowest free one.
    assert config(s1)["replication"] == {"role": "slave", "slave_of": "10.0.0.11:8124", "slave_id": 1,
                                         "port": 8124, "mode": "async"}
    assert config(s2)["replication"] == {"role": "slave", "slave_of": "10.0.0.11:8124", "slave_id": 2,
                                         "port": 9001, "mode": "async"}
    assert config(s2)["broker"]["id"] == 0 and config(s2)["broker"]["port"] == 9000
    assert config(s1)["security"]["replication_secret_file"] == SECRET_FILE
    assert [b.name for b in cluster.members(s2)] == ["m0", "s2", "s1"]
    assert (m0.role_text, s1.role_text) == ("master", "slave of m0")


def test_replication_settings_come_from_the_inventory():
    cluster = parse_inventory(inventory(
        dict(M0, replication_port=7000, listen="0.0.0.0", server={"replication": {"sync_timeout_ms": 500}}),
        dict(S1, replication_port=7001), replication_mode="sync"))
    m0, s1 = cluster.brokers
    assert config(m0)["replication"] == {"sync_timeout_ms": 500, "port": 7000, "mode": "sync"}
    # A master bound to a wildcard is reached at its SSH host.
    assert config(s1)["replication"]["slave_of"] == "10.0.0.11:7000"
    assert config(s1)["replication"]["port"] == 7001 and config(s1)["replication"]["mode"] == "sync"


def test_a_lone_master_with_a_replication_port_opens_it():
    (m0,) = parse_inventory(inventory(dict(M0, replication_port=7000))).brokers
    assert config(m0)["replication"] == {"port": 7000, "mode": "async"}


def test_an_auto_group_renders_members_without_roles():
    cluster = parse_inventory(inventory(M0, S1, S2, ha="auto", zk_connect="zk1:2181/metaq"))
    m0, s1, s2 = cluster.brokers
    assert config(m0)["replication"] == {"ha": "auto", "port": 8124, "slave_id": 0, "mode": "async"}
    assert config(s1)["replication"] == {"ha": "auto", "port": 8124, "slave_id": 1, "mode": "async"}
    assert config(s2)["replication"] == {"ha": "auto", "port": 9001, "slave_id": 2, "mode": "async"}
    assert s2.role_text == "ha auto, member 2 of m0"


def test_auto_needs_zookeeper_on_every_member():
    message = problems(inventory(M0, dict(S1, zk_connect="zk1:2181"), ha="auto"))
    assert ("brokers[0] (m0).zk_connect: required with ha: auto (the group elects its master through ZooKeeper): "
            "set zk_connect in defaults or on every member of m0's group") in message
    assert "brokers[1] (s1).zk_connect" not in message


def test_a_group_shares_its_ha_and_replication_mode():
    message = problems(inventory(M0, dict(S1, ha="auto", replication_mode="sync"), zk_connect="zk1:2181"))
    assert "brokers[1] (s1).ha: 'auto', but its master m0 has 'manual': a group shares one ha mode" in message
    assert ("brokers[1] (s1).replication_mode: 'sync', but its master m0 has 'async': a group shares one "
            "replication_mode") in message


def test_slave_ids_are_the_slaves_and_each_their_own():
    message = problems(inventory(dict(M0, slave_id=1), dict(S1, slave_id=2), dict(S2, slave_id=2)))
    assert "brokers[0] (m0).slave_id: only a slave has one (in ha: auto the master's member id is 0)" in message
    assert "brokers[2] (s2).slave_id: 2 is also s1's: each slave of m0 needs its own" in message
    message = problems(inventory(M0, dict(S1, slave_id=0)))
    assert "brokers[1] (s1).slave_id: Input should be greater than or equal to 1" in message


def test_replication_ports_that_cannot_work():
    message = problems(inventory(dict(M0, port=65535), dict(S1, replication_port=8123)))
    assert "brokers[0] (m0).replication_port: the default, port + 1, is 65536: set replication_port" in message
    assert "brokers[1] (s1).replication_port: 8123 is also its port: each listener needs its own" in message


def test_a_replication_port_is_also_checked_against_the_other_brokers_of_its_host():
    message = problems(inventory(M0, S1, {"name": "b1", "host": "10.0.0.11", "broker_id": 1, "port": 8124,
                                          "install_dir": "/opt/b1", "data_dir": "/var/b1"}))
    assert "brokers[0] (m0).replication_port: 8124 on host 10.0.0.11 is also the port of brokers[2] (b1)" in message


def test_replicating_over_the_network_needs_a_secret():
    secured = {"server": {"security": {"acl_file": "/etc/metaq/acl.yaml"}}}
    text = yaml.safe_dump({"defaults": secured, "brokers": [M0, S1]})
    message = problems(text)
    assert ("brokers[0] (m0): replication with m0's group goes over 10.0.0.11 (not a loopback address) and m0 has "
            "no replication secret: the broker refuses that (protected mode). Set "
            "server.security.replication_secret_file (a file on each host holding the same secret, openssl rand "
            "-hex 32) in defaults or on every member, or server.security.insecure: true") in message
    assert "brokers[1] (s1): replication with m0's group goes over 10.0.0.21" in message
    assert "protected mode" in message and "replication.port listens on" not in message, "said once, by the inventory"
    # On loopback no secret is needed; security.insecure accepts the risk.
    loopback = [dict(M0, host="127.0.0.1"), dict(S1, host="127.0.0.2")]
    assert len(parse_inventory(yaml.safe_dump({"brokers": loopback})).brokers) == 2
    insecure = {"server": {"security": {"insecure": True}}}
    assert len(parse_inventory(yaml.safe_dump({"defaults": insecure, "brokers": [M0, S1]})).brokers) == 2


def test_every_member_has_the_same_secret():
    secret = {"security": {"replication_secret": "a" * 32}}
    message = problems(yaml.safe_dump({"brokers": [
        dict(M0, host="127.0.0.1", server=secret), dict(S1, host="127.0.0.2"),
        dict(S2, host="127.0.0.3", server={"security": {"replication_secret": "b" * 32}})]}))
    assert ("brokers[1] (s1).server.security: m0 has a replication secret and s1 has none: every member of a group "
            "needs the same one") in message
    assert "brokers[2] (s2).server.security.replication_secret: differs from its master m0's" in message


def test_the_inventory_owns_the_replication_roles_and_ports():
    message = problems(inventory(dict(M0, server={"replication": {"port": 7000, "mode": "sync"}}),
                                 dict(S1, server={"replication": {"slave_of": "x:1"}})))
    assert "brokers[0] (m0).server: replication.port is set from the inventory: set `replication_port` instead" \
        in message
    assert "brokers[1] (s1).server: replication.slave_of is set from the inventory: set `master` instead" in message


def test_slaves_name_a_master_of_the_same_id():
    message = problems(inventory(M0, dict(S1, broker_id=3), dict(S2, master="s1")))
    assert "brokers[1] (s1).broker_id: a slave has its master's id (0)" in message
    assert "brokers[2] (s2).master: a slave names its master broker (one of: m0)" in message


def test_start_runs_masters_first_and_stop_slaves_first():
    cluster = parse_inventory(inventory(S1, M0, {"name": "b1", "host": "10.0.0.12", "broker_id": 1}))
    s1, m0, b1 = cluster.brokers
    assert start_waves([s1, m0, b1]) == [[m0, b1], [s1]]
    assert stop_waves([s1, m0, b1], {}) == [[s1], [m0, b1]]
    # After a promotion (or an election), the broker that is master now stops last.
    assert stop_waves([s1, m0, b1], {"s1": "master", "m0": "slave", "b1": None}) == [[m0], [s1, b1]]
    assert start_waves([s1]) == [[s1]] and stop_waves([], {}) == []


def test_fab_check_shows_pairs_and_what_a_restart_costs(tmp_path):
    pytest.importorskip("fabric")
    path = tmp_path / "pairs.yaml"
    path.write_text(inventory(M0, S1, {"name": "b1", "host": "10.0.0.12", "broker_id": 1}, replication_mode="sync"))
    r = run_fab(path, "check", "--show-config")
    assert r.code == 0, r
    placement = r.out.split("ports (- : off):")[0]  # the first table; the ports table follows
    rows = {line.split()[0]: line for line in placement.splitlines() if line.startswith(("m0 ", "s1 ", "b1 "))}
    assert "slave of m0" in rows["s1"] and "8124" in rows["s1"].split("slave of m0")[1], r
    assert "- " in rows["b1"].split("10.0.0.12:22")[1], "b1 has no replication port: %r" % r
    assert ("note: m0 with s1 (ha manual): start runs masters before slaves, stop slaves before masters; "
            "rolling-restart restarts the slaves first, then m0, and sends to broker id 0 fail while m0 is down "
            "(ha: auto hands the writes over instead)") in r.out, r
    assert ("note: m0 replicates in sync mode with one slave: sends to broker id 0 fail while s1 restarts "
            "(503 SLAVE_NOT_AVAILABLE); a second slave avoids that") in r.out, r
    assert "  slave_of: 10.0.0.11:8124\n" in r.out, r


def readme_inventories():
    with open("%s/docs/deploy.md" % REPO, encoding="utf-8") as f:
        section = f.read()
    return [block for block in re.findall(r"```yaml\n(.*?)```", section, re.S)
            if "brokers:" in block and "per_host:" not in block]  # per_host's: tests/deploy/test_placement.py


def test_the_readme_inventories_are_valid_and_render_what_it_says():
    first, pairs = readme_inventories()
    assert [b.name for b in parse_inventory(first).brokers] == ["b0", "b1"]
    m0, s1, m1 = parse_inventory(pairs).brokers
    assert config(m0)["replication"] == {"port": 8124, "mode": "async"}
    assert config(s1)["replication"] == {"role": "slave", "slave_of": "10.0.0.11:8124", "slave_id": 1,
                                         "port": 8124, "mode": "async"}
    assert "replication" not in config(m1)


def test_status_rows_show_the_role_played_the_link_and_the_lag():
    m0, s1 = parse_inventory(inventory(M0, S1)).brokers

    def row(broker, **stats):
        report = {"state": "up", "pid": 7, "version": "0.1.0", "stats": dict(stats, uptime="5")}
        return dict(zip(STATUS_COLUMNS, status_row(broker, report), strict=True))

    r = row(m0, replication_role="master", replication_slaves="2")
    assert (r["ROLE"], r["LINK"], r["REPL_LAG"]) == ("master", "2 slaves", "-")
    r = row(s1, replication_role="slave", replication_link="connected", replication_caught_up="true",
            replication_lag_messages="0")
    assert (r["ROLE"], r["LINK"], r["REPL_LAG"]) == ("slave", "connected", "caught up")
    r = row(s1, replication_role="slave", replication_link="down", replication_caught_up="false",
            replication_lag_messages="120")
    assert (r["LINK"], r["REPL_LAG"]) == ("down", "120 msgs behind")
    assert row(s1, replication_role="slave", replication_lag_messages="-1")["REPL_LAG"] == "unknown"
    assert row(s1, replication_role="master")["ROLE"] == "master (inventory: slave)"
    assert row(m0, replication_role="slave")["ROLE"] == "slave (inventory: master)"
    down = dict(zip(STATUS_COLUMNS, status_row(s1, {"state": "down", "message": "not running"}), strict=True))
    assert (down["ROLE"], down["LINK"], down["REPL_LAG"]) == ("slave", "-", "-")
    report = {"state": "up", "stats": {"replication_role": "slave", "replication_link": "down",
                                       "replication_master": "10.0.0.11:8124"}}
    assert status_note(s1, report) == "s1: replication link to 10.0.0.11:8124 is down (fab logs --only s1)"
    assert status_note(m0, {"state": "up", "stats": {"replication_role": "master"}}) is None
