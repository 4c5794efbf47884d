"""A broker loads the code of what its configuration turns on, and nothing else (metaq/server/broker.py assembles
each optional part where it is set): a standalone broker with the default settings starts without the MQTT port,
the MQTT cluster, the gRPC port, the HTTP port and dashboard, the remoting port, ZooKeeper's client or Spark.

Each check runs the broker in a fresh interpreter, as ``metaq-server`` does (gevent patched first), and reads that
process's ``sys.modules``."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from metaq.client.local import free_port, small_config

pytestmark = pytest.mark.integration  # broker processes

#: What a configuration may leave off (a package, or one module of a package the broker needs).
OPTIONAL = ("metaq.mqtt", "metaq.mqttcluster", "metaq.serving.wsio", "metaq.rmq5", "metaq.server.http",
            "metaq.server.remoting", "kazoo.client", "metaq.spark")

#: Run in the child: assemble (and with ``start``, start and stop) a broker of the config file, print its modules.
CHILD = """
from gevent import monkey
monkey.patch_all()
import json, sys
from metaq.server.config import read_config
from metaq.server.broker import Broker
import gevent
broker = Broker(read_config(sys.argv[1], {}, {}))
if sys.argv[2] in ("start", "registered"):
    broker.start()
    while sys.argv[2] == "registered" and not broker.registry.registrations:
        gevent.sleep(0.05)
    broker.stop()
print(json.dumps(sorted(sys.modules)))
"""


def loaded(workdir, config, start=False):
    """The modules a broker of ``config`` has loaded once assembled (and started and stopped with ``start``; with
    ``start="registered"``, stopped once registered in ZooKeeper)."""
    workdir.mkdir()
    path = workdir / "server.yaml"
    path.write_text(yaml.safe_dump(config))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    mode = {True: "start", False: "assemble"}.get(start, start)
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], env=env, capture_output=True, text=True,
                         timeout=60, cwd=str(workdir))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def of(modules, package):
    """What of ``package`` is loaded, its named limits aside: the settings' defaults and bounds read them (constants
    and a docstring, as ``metaq.limits``), whichever part the settings turn on."""
    return [m for m in modules if (m == package or m.startswith(package + ".")) and m != package + ".limits"
            and not (m == package and package + ".limits" in modules)]


def test_a_standalone_broker_with_the_default_settings_loads_no_optional_part(tmp_path):
    modules = loaded(tmp_path / "b", small_config(tmp_path / "b" / "data"), start=True)
    assert {package: of(modules, package) for package in OPTIONAL if of(modules, package)} == {}


def test_each_optional_part_is_loaded_when_its_setting_turns_it_on(tmp_path):
    """The check above names what a broker does load when asked to: a started broker with every port on, and one
    in a cluster assembled (its ZooKeeper never reached), bring in every optional part but Spark (a client's)."""
    ports = {"mqtt": {"port": free_port(), "ws_port": free_port()}, "grpc": {"port": free_port()},
             "http": {"port": free_port()}, "remoting": {"port": free_port()}}
    started = loaded(tmp_path / "ports", small_config(tmp_path / "ports" / "data", **ports), start=True)
    clustered = loaded(tmp_path / "zk", small_config(tmp_path / "zk" / "data", mqtt={"port": 1883},
                                                     zk={"connect": "127.0.0.1:2181"}))
    assert [package for package in OPTIONAL if not of(started + clustered, package)] == ["metaq.spark"]


def test_a_broker_registered_in_zookeeper_loads_no_remoting_it_does_not_serve(tmp_path, zk_connect):
    """Its listeners' addresses, registered from a greenlet while it serves, are made without the remoting port's
    code (which a first import there would read from disk on the loop)."""
    config = small_config(tmp_path / "b" / "data", http={"port": free_port()}, zk={"connect": zk_connect})
    modules = loaded(tmp_path / "b", config, start="registered")
    assert "metaq.server.registry" in modules and of(modules, "metaq.server.remoting") == []
