"""The cluster inventory: every mistake is refused with a message that says where and what."""

import os
import textwrap

import pytest
import yaml

from metaq.deploy.inventory import InventoryError, load_inventory, parse_inventory
from tests.harness.fab import REPO, run_fab

GOOD = """
cluster: orders
defaults:
  ssh_user: deploy
  install_dir: /opt/metaq
  data_dir: /var/lib/metaq
  zk_connect: zk1:2181,zk2:2181/metaq
  server:
    store: {flush: async}
    topics: [{name: "*", partitions: 4}]
    security: {acl_file: /etc/metaq/acl.yaml}
brokers:
  - {name: b0, host: 10.0.0.11, broker_id: 0}
  - {name: b1, host: 10.0.0.12, broker_id: 1, port: 9123, server: {store: {flush: sync}}}
"""


def problems(text):
    with pytest.raises(InventoryError) as info:
        parse_inventory(textwrap.dedent(text), "cluster.yaml")
    message = str(info.value)
    assert message.startswith("cluster.yaml")
    return message


#: Brokers on real (non-loopback) addresses need authentication on, or the broker refuses to start (protected mode).
SECURED = {"server": {"security": {"acl_file": "/etc/metaq/acl.yaml"}}}


def with_brokers(*brokers, defaults=None):
    return yaml.safe_dump({"defaults": SECURED if defaults is None else defaults, "brokers": list(brokers)})


def test_a_public_address_with_authentication_off_is_refused_by_check():
    message = problems(with_brokers({"name": "b0", "host": "10.0.0.11", "broker_id": 0}, defaults={}))
    assert "brokers[0] (b0).server: broker.host 10.0.0.11 is not a loopback address and authentication is off" \
        in message


def test_a_good_inventory_resolves_defaults_and_renders_each_server_yaml():
    cluster = parse_inventory(GOOD)
    b0, b1 = cluster.brokers
    assert (b0.name, b0.host, b0.listen, b0.port, b0.ssh_user, b0.ssh_port) == ("b0", "10.0.0.11", "10.0.0.11", 8123,
                                                                                "deploy", 22)
    assert b1.port == 9123 and b1.label == "b1 (deploy@10.0.0.12:22)"
    config = yaml.safe_load(b1.config_text)
    assert config["broker"] == {"id": 1, "host": "10.0.0.12", "port": 9123, "data_dir": "/var/lib/metaq"}
    assert config["zk"] == {"connect": "zk1:2181,zk2:2181/metaq"}
    assert config["store"] == {"flush": "sync"} and config["topics"] == [{"name": "*", "partitions": 4}]
    assert yaml.safe_load(b0.config_text)["store"] == {"flush": "async"}
    assert b1.config_text.startswith("# metaq broker b1 (broker id 1) of cluster orders.")
    # Rendering is deterministic: the checksum is how a second deploy knows nothing changed.
    assert parse_inventory(GOOD).brokers[1].config_sha256 == b1.config_sha256
    assert [b.name for b in cluster.select("b1")] == ["b1"]


def test_the_shipped_example_is_valid():
    cluster = load_inventory(os.path.join(REPO, "conf", "cluster.yaml"))
    assert [(b.name, b.broker_id, b.role) for b in cluster.brokers] == [("b0", 0, "master"), ("b1", 1, "master")]


def test_field_errors_name_the_broker_and_the_field():
    message = problems(with_brokers({"name": "b0", "host": "h0", "broker_id": 0, "port": 70000},
                                    {"name": "b1", "host": "h1", "broker_id": 1, "ssh_port": 0, "prot": 1}))
    assert "brokers[0] (b0).port: Input should be less than or equal to 65535" in message
    assert "brokers[1] (b1).ssh_port: Input should be greater than or equal to 1" in message
    assert "brokers[1] (b1).prot: Extra inputs are not permitted" in message


@pytest.mark.parametrize("path", ["/", "/opt", "opt/metaq", "/opt/../etc", "/opt/my metaq", "/opt/$HOME"])
def test_install_dirs_must_be_safe_absolute_paths(path):
    message = problems(with_brokers({"host": "h0", "broker_id": 0, "install_dir": path}))
    assert "brokers[0] (h0).install_dir: must be an absolute path at least two levels deep" in message


def test_clashes_between_brokers():
    message = problems(with_brokers(
        {"name": "a", "host": "h", "broker_id": 0, "server": {"store": {"flush": "x"}}},
        {"name": "a", "host": "h2", "broker_id": 0},
        {"name": "c", "host": "h", "broker_id": 2, "install_dir": "/srv/c", "data_dir": "/var/lib/metaq"},
    ))
    assert "brokers[1] (a): same name (give each broker a unique `name`) as brokers[0] (a)" in message
    assert "brokers[1] (a): same broker_id as brokers[0] (a)" in message
    assert "brokers[2] (c): same host and port as brokers[0] (a)" in message
    assert "brokers[2] (c): same host and data_dir as brokers[0] (a)" in message
    assert "brokers[0] (a).server: store.flush: Input should be 'sync' or 'async'" in message


def test_data_inside_the_install_dir_is_refused():
    message = problems(with_brokers({"host": "h", "broker_id": 0, "install_dir": "/opt/metaq",
                                     "data_dir": "/opt/metaq/data"}))
    assert "brokers[0] (h).data_dir: /opt/metaq/data is inside the install_dir /opt/metaq of h" in message


def test_a_master_needs_an_id_and_a_slave_needs_its_master():
    message = problems(with_brokers({"name": "m", "host": "h1"},
                                    {"name": "s", "host": "h2", "role": "slave"},
                                    {"name": "t", "host": "h3", "role": "slave", "master": "nobody"}))
    assert "brokers[0] (m).broker_id: required for a master" in message
    assert "brokers[1] (s).master: a slave names its master broker (one of: m)" in message
    assert "brokers[2] (t).master: a slave names its master broker" in message


def test_server_settings_are_checked_as_the_broker_checks_them():
    message = problems(with_brokers({"host": "h", "broker_id": 0, "zk_connect": "nohost",
                                     "server": {"store": {"flush": "sometimes"}, "topcs": []}}))
    assert "brokers[0] (h).server: " in message
    assert "store.flush: Input should be 'sync' or 'async'" in message
    assert "zk.connect: expected HOST:PORT" in message
    assert "topcs: Extra inputs are not permitted" in message


def test_settings_the_inventory_owns_cannot_be_set_under_server():
    message = problems(with_brokers({"host": "h", "broker_id": 0, "server": {"broker": {"port": 1}}}))
    assert "brokers[0] (h).server: broker.port is set from the inventory: set `port` instead" in message


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(InventoryError, match="cannot read the inventory .*nothere.yaml: No such file"):
        load_inventory(tmp_path / "nothere.yaml")
    assert "is not valid YAML" in problems("brokers: [\n")
    assert "expected a mapping with `brokers:`" in problems("- just a list\n")
    assert "brokers: list at least one broker (or give per_host:)" in problems("cluster: x\n")
    with pytest.raises(InventoryError, match=r"no broker named 'b9' \(brokers: b0, b1\)"):
        parse_inventory(GOOD).select("b0,b9")


def test_fab_reports_an_invalid_inventory_and_exits_2(tmp_path):
    pytest.importorskip("fabric")
    path = tmp_path / "bad.yaml"
    path.write_text(with_brokers({"host": "h", "broker_id": 0, "port": 0}))
    r = run_fab(path, "deploy")
    assert r.code == 2, r
    assert r.err.strip() == "%s is invalid:\n  brokers[0] (h).port: Input should be greater than or equal to 1" % path


def test_a_key_written_twice_is_refused_with_its_line():
    message = problems("""
        cluster: orders
        brokers:
          - {name: b0, host: 10.0.0.11, broker_id: 0}
        cluster: payments
    """)
    assert "line 5" in message and "'cluster'" in message and "first at line 2" in message


MQTT_ISLANDS = """
cluster: devices
defaults:
  zk_connect: zk1:2181/metaq
  server:
    mqtt: {port: 1883}
    security: {acl_file: /etc/metaq/acl.yaml, insecure: true}
brokers:
  - {name: b0, host: 10.0.0.11, broker_id: 0}
  - {name: b1, host: 10.0.0.12, broker_id: 1, replication_port: 8124}
"""


def test_fab_check_says_which_mqtt_masters_cannot_be_in_the_mqtt_cluster(tmp_path):
    from metaq.deploy.inventory import mqtt_cluster_notes

    note = ("b0: mqtt cluster: off (no replication port): the other masters cannot follow it, so what its MQTT "
            "clients publish reaches only its own subscribers; give every master a replication_port to make them "
            "one MQTT service")
    assert mqtt_cluster_notes(parse_inventory(MQTT_ISLANDS).brokers) == [note]  # b1 has one: it is a member
    pytest.importorskip("fabric")
    path = tmp_path / "cluster.yaml"
    path.write_text(MQTT_ISLANDS)
    r = run_fab(path, "check")
    assert r.code == 0 and "note: %s" % note in r.out, r
