"""``fab files``: the files a broker's settings name on its host (ACL, replication secret, TLS, the agent's
credentials) sent from local paths with mode 0600, never held in the inventory; ``fab check`` prints every port."""

import os
import stat

import pytest
import yaml

from metaq.deploy import files
from metaq.deploy.inventory import InventoryError, parse_inventory
from tests.harness.fab import run_fab, two_broker_inventory, write_inventory


def _inventory(root, sshd=None):
    """b0 and b1 with their ACL file, replication secret and TLS files named under their own host dirs."""
    if sshd is None:
        inventory = {"cluster": "test", "defaults": {"server": {}}, "brokers": [
            {"name": "b%d" % i, "host": host, "broker_id": i, "port": 9100 + 10 * i,
             "install_dir": "%s/host%d/opt/metaq" % (root, i), "data_dir": "%s/host%d/var/metaq" % (root, i)}
            for i, host in enumerate(("127.0.0.1", "127.0.0.2"))]}
    else:
        inventory = two_broker_inventory(root, sshd)
    for i, b in enumerate(inventory["brokers"]):
        etc = "%s/host%d/etc/metaq" % (root, i)
        b["server"] = {"security": {"acl_file": etc + "/acl.yaml", "replication_secret_file": etc + "/replication",
                                    "tls": {"cert": etc + "/broker.pem", "key": etc + "/broker.key"}},
                       "mqtt": {"port": 9200 + 10 * i}}
    return inventory


def _local(tmp_path):
    src = tmp_path / "local"
    src.mkdir()
    (src / "acl.yaml").write_text("users: {}\n")
    (src / "replication").write_text("s" * 40)
    for host in ("127.0.0.1", "127.0.0.2"):
        (src / ("%s.pem" % host)).write_text("cert of %s" % host)
        (src / ("%s.key" % host)).write_text("key of %s" % host)
    return src


def test_each_file_goes_where_the_brokers_settings_say_per_host_templates_filled(tmp_path):
    src = _local(tmp_path)
    cluster = parse_inventory(yaml.safe_dump(_inventory(tmp_path)))
    b1 = cluster.brokers[1]
    plan = files.planned(b1, {"acl": str(src / "acl.yaml"), "cert": str(src / "{host}.pem"), "key": None})
    etc = "%s/host1/etc/metaq" % tmp_path
    assert plan == [("acl", str(src / "acl.yaml"), etc + "/acl.yaml"),
                    ("cert", str(src / "127.0.0.2.pem"), etc + "/broker.pem")]


def test_a_file_for_a_setting_the_broker_does_not_set_or_missing_here_is_refused_by_name(tmp_path):
    src = _local(tmp_path)
    b0 = parse_inventory(yaml.safe_dump(_inventory(tmp_path))).brokers[0]
    with pytest.raises(InventoryError, match=r"b0: the TLS CA given but server\.security\.tls\.ca is not set"):
        files.planned(b0, {"ca": str(src / "acl.yaml")})
    with pytest.raises(InventoryError, match=r"b0: the agent's credentials file given but credentials is not set"):
        files.planned(b0, {"credentials": str(src / "acl.yaml")})
    with pytest.raises(InventoryError, match=r"b0: the replication secret: no file .*/nowhere here"):
        files.planned(b0, {"secret": str(tmp_path / "nowhere")})


@pytest.mark.slow
def test_fab_files_sends_each_file_with_mode_0600_and_refuses_before_sending_anything(sshd, tmp_path):
    src = _local(tmp_path)
    inventory = _inventory(tmp_path, sshd)
    path = write_inventory(tmp_path / "cluster.yaml", inventory)
    r = run_fab(path, "files", "--acl", src / "acl.yaml", "--ca", src / "acl.yaml")
    assert r.code == 2 and "server.security.tls.ca is not set" in r.err, r
    assert not os.path.exists("%s/host0/etc/metaq/acl.yaml" % tmp_path)  # nothing sent
    r = run_fab(path, "files", "--acl", src / "acl.yaml", "--secret", src / "replication",
                "--cert", str(src / "{host}.pem"), "--key", str(src / "{host}.key"))
    assert r.code == 0, r
    for i, host in enumerate(("127.0.0.1", "127.0.0.2")):
        etc = tmp_path / ("host%d" % i) / "etc" / "metaq"
        assert stat.S_IMODE(os.stat(etc).st_mode) == 0o700
        for name, text in (("acl.yaml", "users: {}\n"), ("replication", "s" * 40),
                           ("broker.pem", "cert of %s" % host), ("broker.key", "key of %s" % host)):
            assert (etc / name).read_text() == text
            assert stat.S_IMODE(os.stat(etc / name).st_mode) == 0o600, name
        assert "[b%d] sent acl -> %s/acl.yaml" % (i, etc) in r.out, r
    assert "users:" not in path.read_text() and "s" * 40 not in path.read_text()  # never in the inventory


@pytest.mark.slow
def test_fab_check_prints_every_port_of_every_broker(tmp_path):
    path = write_inventory(tmp_path / "cluster.yaml", _inventory(tmp_path))
    r = run_fab(path, "check")
    assert r.code == 0, r
    lines = r.out.splitlines()
    at = lines.index("ports (- : off):")
    assert lines[at + 1].split() == ["BROKER", "LISTEN", "TEXT", "REPLICATION", "REMOTING", "HTTP", "MQTT", "GRPC"]
    assert lines[at + 3].split() == ["b0", "127.0.0.1", "9100", "-", "-", "-", "9200", "-"], r
    assert lines[at + 4].split() == ["b1", "127.0.0.2", "9110", "-", "-", "-", "9210", "-"], r
