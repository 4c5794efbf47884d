"""The configuration files shipped in conf/, run as written: `make run`'s conf/server.yaml (a laptop's footprint)
and conf/slave.yaml (a slave of that broker on the same machine; README "Replication"). Real metaq-server processes
read the files themselves; only ports (taken by a reader's own `make run`, or another test) are given by flags."""

import os
import pathlib

import yaml

from metaq.client import Message, Producer
from metaq.client.local import BrokerProcess, free_port
from metaq.server.config import load_config
from tests.harness.broker import consume_all, wait_for

CONF = pathlib.Path(__file__).resolve().parents[2] / "conf"


def shipped(workdir, name, *flags):
    """A broker process reading conf/<name> exactly as shipped (copied into ``workdir``), with ``flags``."""
    text = (CONF / name).read_text()
    b = BrokerProcess(workdir, yaml.safe_load(text), list(flags))
    b.config_text = text
    return b


def disk_bytes(directory):
    """Bytes of disk the files under ``directory`` take (allocated blocks, not apparent sizes)."""
    return sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _dirs, files in os.walk(directory) for f in files)


def test_the_slave_config_is_a_slave_of_the_server_config():
    """What a slave must share with its master, and what it must not (ports, data directory)."""
    master, slave = load_config(str(CONF / "server.yaml")), load_config(str(CONF / "slave.yaml"))
    assert (slave.replication.role, slave.replication.slave_of) == ("slave", "127.0.0.1:8124")
    assert slave.broker.id == master.broker.id and slave.store.segment_size == master.store.segment_size
    assert slave.topics == master.topics
    assert slave.broker.data_dir != master.broker.data_dir
    ports = {master.broker.port, master.http.port, 8124}  # the master's text, HTTP and (by flag) replication ports
    assert not ports & {slave.broker.port, slave.http.port, slave.replication.port}


def test_replication_as_the_shipped_files_describe_it(tmp_path):
    repl = free_port()
    master = shipped(tmp_path / "master", "server.yaml", "--port", str(free_port()), "--mqtt-port", str(free_port()),
                     "--http-port", str(free_port()), "--replication-port", str(repl))
    slave = shipped(tmp_path / "slave", "slave.yaml", "--port", str(free_port()), "--http-port", str(free_port()),
                    "--replication-port", str(free_port()), "--slave-of", "127.0.0.1:%d" % repl)
    for b in (master, slave):
        os.makedirs(b.workdir)
    try:
        master.start()
        slave.start()
        with master.client() as c:
            stored = [c.put_ok("test", b"order %d" % i, 2)[2] for i in range(3)]
        assert stored == [0, 1, 2]

        def on_slave():
            with slave.client() as c:
                return [r.payload for r in consume_all(c, "test", 2)]
        wait_for(lambda: len(on_slave()) == 3, 20, "the slave has the master's messages")
        assert on_slave() == [b"order 0", b"order 1", b"order 2"]
        with slave.client() as c:
            assert c.put("test", b"x", 2).code == 503  # a slave refuses puts
            assert c.stats_dict()["replication_role"] == "slave"
        assert os.path.isdir(tmp_path / "slave" / "data-slave") and os.path.isdir(tmp_path / "master" / "data")
    finally:
        slave.kill()
        master.kill()


def test_a_new_data_dir_of_the_shipped_config_fits_a_laptop(tmp_path):
    b = shipped(tmp_path, "server.yaml", "--port", str(free_port()), "--http-port", str(free_port()),
                "--mqtt-port", str(free_port()),
                "--data-dir", str(tmp_path / "fresh"))
    b.start()
    try:
        with Producer(brokers=["meta://127.0.0.1:%d" % b.port]) as producer:
            assert producer.send(Message("test", b"hello", key="order-42")).success  # keyed: the key index is made
        # a moment after: a segment the worker prepared while the first put made its own is deleted by then
        wait_for(lambda: len(os.listdir(tmp_path / "fresh" / "commitlog")) == 1, timeout=10,
                 what="one segment in the commit log")
        used = disk_bytes(tmp_path / "fresh")
    finally:
        b.kill()
    assert (tmp_path / "fresh" / "keyindex").is_dir()
    assert 64 << 20 <= used < 80 << 20, used  # one 64 MiB segment and a 3.75 MiB key index (the defaults: 1.1 GB)
