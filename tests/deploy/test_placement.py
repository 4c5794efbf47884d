"""``per_host:``: N brokers per host (one per core by default), master/slave groups spread over the hosts."""

import random
import re

import pytest
import yaml

from metaq.deploy.inventory import InventoryError, parse_inventory
from metaq.deploy.placement import place
from tests.harness.fab import REPO


def groups(placed):
    out = {}
    for s in placed:
        out.setdefault(s.group, []).append(s)
    return [sorted(g, key=lambda s: s.member) for _, g in sorted(out.items())]


def check(slots, slaves):
    """place()'s promises for ``slots`` and ``slaves``; the placement."""
    placed, unused = place(slots, slaves)
    hosts = len(slots)
    per_host = [sum(1 for s in placed if s.host == h) for h in range(hosts)]
    assert all(n <= cap for n, cap in zip(per_host, slots, strict=True)) and sum(per_host) + unused == sum(slots)
    for h in range(hosts):  # a host's brokers are numbered 0.. (their ports and directories)
        assert sorted(s.k for s in placed if s.host == h) == list(range(per_host[h]))
    for g in groups(placed):
        assert [s.member for s in g] == list(range(1 + slaves))
        master = g[0].host
        if hosts >= 2:
            assert all(s.host != master for s in g[1:]), g  # a slave never on its master's host
        if 1 + slaves <= hosts and len(set(slots)) == 1:  # hosts alike: a group on as many hosts as it has members
            assert len({s.host for s in g}) == len(g), g
    return placed, unused


def test_two_hosts_of_two_cores_hold_two_groups_crosswise():
    placed, unused = check([2, 2], 1)
    assert unused == 0
    assert [[(s.host, s.k) for s in g] for g in groups(placed)] == [[(0, 0), (1, 0)], [(1, 1), (0, 1)]]


def test_masters_are_spread_evenly():
    for slots, slaves in (([4, 4, 4], 2), ([2, 2, 2], 1), ([8, 8, 8, 8], 1), ([3, 3], 0)):
        placed, unused = check(slots, slaves)
        masters = [sum(1 for s in placed if s.member == 0 and s.host == h) for h in range(len(slots))]
        assert max(masters) - min(masters) <= 1, (slots, slaves, masters)
        assert unused == sum(slots) % (1 + slaves), (slots, slaves)


def test_one_host_keeps_its_groups_and_says_what_is_left():
    placed, unused = check([3], 1)
    assert unused == 1 and [(s.host, s.member) for s in placed] == [(0, 0), (0, 1)]


def test_a_slave_never_goes_to_its_masters_host_even_when_slots_are_left():
    placed, unused = check([4, 1], 1)
    assert (len(groups(placed)), unused) == (1, 3)


def test_random_layouts_keep_every_promise():
    rnd = random.Random(56)
    for _ in range(500):
        check([rnd.randint(1, 8) for _ in range(rnd.randint(1, 5))], rnd.randint(0, 3))
        check([rnd.randint(1, 8)] * rnd.randint(1, 5), rnd.randint(0, 3))


INVENTORY = """
cluster: percore
defaults:
  ssh_user: root
  install_dir: /opt/metaq
  data_dir: /var/lib/metaq
  zk_connect: zk1:2181/metaq
  server:
    mqtt: {port: 1883}
    http: {port: 8180}
per_host:
  hosts: [127.0.0.1, 127.0.0.2]
  slaves: 1
"""


def test_per_host_renders_the_brokers_one_per_core_by_default():
    asked = []
    cluster = parse_inventory(INVENTORY, cores=lambda host, ssh: asked.append((host, ssh["ssh_user"])) or 2)
    assert asked == [("127.0.0.1", "root"), ("127.0.0.2", "root")]
    rows = [(b.name, b.role, b.broker_id, b.host, b.port, b.replication_port, b.install_dir, b.data_dir, b.slave_of)
            for b in cluster.brokers]
    assert rows == [
        ("127.0.0.1-0", "master", 0, "127.0.0.1", 8123, 8124, "/opt/metaq/127.0.0.1-0",
         "/var/lib/metaq/127.0.0.1-0", None),
        ("127.0.0.2-0", "slave", 0, "127.0.0.2", 8123, 8124, "/opt/metaq/127.0.0.2-0",
         "/var/lib/metaq/127.0.0.2-0", "127.0.0.1:8124"),
        ("127.0.0.2-1", "master", 1, "127.0.0.2", 8133, 8134, "/opt/metaq/127.0.0.2-1",
         "/var/lib/metaq/127.0.0.2-1", None),
        ("127.0.0.1-1", "slave", 1, "127.0.0.1", 8133, 8134, "/opt/metaq/127.0.0.1-1",
         "/var/lib/metaq/127.0.0.1-1", "127.0.0.2:8134")]
    second = yaml.safe_load(cluster.brokers[2].config_text)
    assert (second["mqtt"]["port"], second["http"]["port"]) == (1893, 8190)  # each port of broker k: + 10 k
    assert cluster.notes == ("per_host: 4 brokers on 127.0.0.1, 127.0.0.2 (2, 2); 2 groups of a master and 1 "
                             "slaves",)


def test_per_host_with_a_count_and_brokers_beside():
    text = INVENTORY.replace("  slaves: 1", "  slaves: 0\n  brokers: 3\n  first_broker_id: 10") + \
        "brokers:\n  - {name: solo, host: 127.0.0.3, broker_id: 0}\n"
    cluster = parse_inventory(text)  # no cores asked: the count is given
    assert [(b.name, b.broker_id) for b in cluster.brokers] == [
        ("solo", 0), ("127.0.0.1-0", 10), ("127.0.0.2-0", 11), ("127.0.0.1-1", 12), ("127.0.0.2-1", 13),
        ("127.0.0.1-2", 14), ("127.0.0.2-2", 15)]


def test_per_host_refusals():
    with pytest.raises(InventoryError, match="per_host.brokers: null means one broker per core"):
        parse_inventory(INVENTORY)
    with pytest.raises(InventoryError, match="a host is named twice: 127.0.0.1"):
        parse_inventory(INVENTORY.replace("127.0.0.2]", "127.0.0.1]"), cores=lambda h, s: 2)
    with pytest.raises(InventoryError, match="port_step"):  # 10 apart at least 2: text and replication ports
        parse_inventory(INVENTORY + "  port_step: 1\n", cores=lambda h, s: 2)
    too_many = parse_inventory(INVENTORY.replace("slaves: 1", "slaves: 0\n  first_broker_id: 1020"),
                               cores=lambda h, s: 2)
    assert [b.broker_id for b in too_many.brokers] == [1020, 1021, 1022, 1023]  # the last id
    with pytest.raises(InventoryError, match="less than or equal to 1023"):
        parse_inventory(INVENTORY.replace("slaves: 1", "slaves: 0\n  first_broker_id: 1021"), cores=lambda h, s: 2)


def test_per_host_refuses_a_port_step_that_lands_one_brokers_port_on_anothers():
    # mqtt 1883 and http 1885: with port_step 2, broker 1's mqtt port is broker 0's http port
    clash = INVENTORY.replace("8180", "1885") + "  port_step: 2\n  brokers: 2\n"
    with pytest.raises(InventoryError) as err:
        parse_inventory(clash)
    assert ".server.mqtt.port: 1885 on host 127.0.0.1 is also the server.http.port of brokers[0] (127.0.0.1-0)" \
        in str(err.value)
    ok = parse_inventory(INVENTORY.replace("8180", "1885") + "  port_step: 4\n  brokers: 2\n")  # one step past
    assert sorted(yaml.safe_load(b.config_text)["mqtt"]["port"] for b in ok.brokers) == [1883, 1883, 1887, 1887]
    text_on_http = INVENTORY.replace("8180", "8125") + "  port_step: 2\n  brokers: 2\n"  # text 8123 + 2
    with pytest.raises(InventoryError, match=r"server.http.port: 8125 on host 127.0.0.\d is also the port of"):
        parse_inventory(text_on_http)


@pytest.mark.parametrize("page", ["deploy.md", "cluster.md"])
def test_the_docs_per_host_inventories_place_what_they_say(page):
    """Three hosts of 4 cores: 12 brokers, 6 groups of a master and its slave, two masters a host, MQTT on 8883 +
    10 k (what the pages say of their per_host: inventories)."""
    with open("%s/docs/%s" % (REPO, page), encoding="utf-8") as f:
        blocks = [b for b in re.findall(r"```yaml\n(.*?)```", f.read(), re.S) if "per_host:" in b]
    assert blocks
    for text in blocks:
        cluster = parse_inventory(text, cores=lambda host, ssh: 4)
        brokers = {b.name: b for b in cluster.brokers}
        masters = [b for b in brokers.values() if b.role == "master"]
        assert len(brokers) == 12 and sorted(b.broker_id for b in masters) == list(range(6))
        assert sorted(sum(1 for m in masters if m.host == h) for h in {b.host for b in brokers.values()}) == [2, 2, 2]
        assert all(b.host != brokers[b.master].host for b in brokers.values() if b.role == "slave")
        mqtt = {(b.host, yaml.safe_load(b.config_text)["mqtt"]["port"]) for b in brokers.values()}
        assert len(mqtt) == 12 and {port for _h, port in mqtt} == {8883, 8893, 8903, 8913}
