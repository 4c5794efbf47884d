"""README "What it is": MetaQ's own Python producer works unchanged — tested with the real package.

MetaQ's Python producer is ``metaq`` 0.1 on PyPI (killme2008's ``contrib/python/meta-python``): ``producer.py``
(broker discovery in ZooKeeper's legacy layout, the ``put`` line, reading the reply) and ``zkclient.py`` (a
wrapper of the zkpython C binding). It is Python 2 code. The test downloads the sdist (pip, into a cache beside
the virtualenv: nothing third-party is committed here), and runs its ``producer.py`` ported to Python 3
mechanically:

* ``lib2to3`` with every fixer (print, ``except X, e``, ``<>``, ``long``, ``urlparse``);
* the three edits 2to3 cannot make, each applied to one exact line (the test fails if the line is not there):
  the request string is encoded to bytes before ``sendall`` and the reply file is opened as latin-1 text (Python
  3 sockets carry bytes), and ``list.sort(cmp=...)`` becomes the equivalent ``key=`` (Python 3 has no ``cmp``);
* ``zkclient.py`` is replaced by the same interface (``ZKClient(servers, timeout)``, ``get``, ``get_children``
  with a watcher, ``watchmethod``, ``close``) over kazoo, since zkpython does not build for Python 3.

Everything else — how it finds brokers (``/meta/brokers/topics/<topic>/<id>-m`` and ``ids/<id>/master``), the
6-token put it writes, how it parses ``result 200 <len> <opaque>`` and the ``msgId partition offset`` body — is
its own code, run unchanged.
"""

import os
import subprocess
import sys
import tarfile

import pytest

from metaq.client.local import small_config
from tests.harness.broker import wait_for

SDIST = "metaq-0.1.tar.gz"
CACHE = os.path.join(os.path.dirname(sys.executable), os.pardir, "thirdparty")

# (exact text after 2to3, replacement): what 2to3 cannot port
EDITS = [
    ("        self.socket.sendall(msg)\n", "        self.socket.sendall(msg.encode('latin-1'))\n"),
    ("        self.fd=s.makefile()\n", "        self.fd=s.makefile('r', encoding='latin-1', newline='')\n"),
    ("partition_list.sort(cmp = Partition.partition_comp)",
     "partition_list.sort(key=lambda p: (p.broker_id, p.partition))"),
]

ZKCLIENT = '''"""zkclient.py's interface over kazoo (zkpython, which the original wraps, does not build for
Python 3)."""
from collections import namedtuple

from kazoo.client import KazooClient

zookeeper = None  # imported by producer.py, unused there
ClientEvent = namedtuple("ClientEvent", "type, connection_state, path")


def watchmethod(func):
    def decorated(event):
        return func(ClientEvent(event.type, event.state, event.path))
    return decorated


class ZKClient(object):
    def __init__(self, servers, timeout=10000):
        self.zk = KazooClient(hosts=servers, timeout=timeout / 1000.0)
        self.zk.start(timeout=timeout / 1000.0)

    def get(self, path, watcher=None):
        data, stat = self.zk.get(path, watch=watcher)
        return data.decode(), stat

    def get_children(self, path, watcher=None):
        return self.zk.get_children(path, watch=watcher)

    def close(self):
        self.zk.stop()
        self.zk.close()
'''

SEND = '''
import sys
from producer import Message, MessageProducer
connect, topic = sys.argv[1], sys.argv[2]
p = MessageProducer(topic, zk_servers=connect, debug=False)
for body in sys.argv[3:]:
    result = p.send(Message(topic, body))
    print("%s %s %s %s" % (result.success, result.partition, result.offset, result.error))
p.close()
'''


def sdist():
    path = os.path.join(CACHE, SDIST)
    if not os.path.exists(path):
        os.makedirs(CACHE, exist_ok=True)
        out = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                              "-d", CACHE, "metaq==0.1"], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and os.path.exists(path), "could not download MetaQ's producer (metaq 0.1 from " \
                                                           "PyPI): %s" % out.stderr[-2000:]
    return path


def port(workdir):
    """producer.py from the sdist, ported as the module docstring says, beside the kazoo zkclient."""
    with tarfile.open(sdist()) as tar:
        source = tar.extractfile("metaq-0.1/metaq/producer.py").read().decode()
    target = os.path.join(workdir, "producer.py")
    with open(target, "w") as f:
        f.write(source)
    out = subprocess.run([sys.executable, "-W", "ignore", "-m", "lib2to3", "-w", "-n", "-f", "all", target],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    with open(target) as f:
        text = f.read()
    for old, new in EDITS:
        assert text.count(old) == 1, "producer.py no longer has %r: the port is out of date" % old
        text = text.replace(old, new)
    with open(target, "w") as f:
        f.write(text)
    with open(os.path.join(workdir, "zkclient.py"), "w") as f:
        f.write(ZKCLIENT)
    with open(os.path.join(workdir, "send.py"), "w") as f:
        f.write(SEND)


@pytest.fixture
def zk_broker(broker_factory, zk_connect, tmp_path):
    from kazoo.client import KazooClient

    b = broker_factory(small_config(tmp_path / "data", zk={"connect": zk_connect},
                                    topics=[{"name": "orders", "partitions": 3}, {"name": "*", "partitions": 1}]))
    with b.client() as c:
        c.put_ok("orders", b"create", 0)  # the topic exists: registered under brokers/topics/orders
    zk = KazooClient(hosts=zk_connect)
    zk.start(timeout=15)
    try:
        wait_for(lambda: zk.exists("/meta/brokers/topics/orders/7-m") is not None, 20, "the legacy topic node")
    finally:
        zk.stop()
        zk.close()
    return b


def test_metaqs_own_python_producer_sends_through_zookeeper_and_its_messages_are_stored(zk_broker, zk_connect,
                                                                                       tmp_path):
    workdir = tmp_path / "metaq-0.1"
    workdir.mkdir()
    port(str(workdir))
    bodies = ["http://www.taobao.com", "second message", "third: 3"]
    out = subprocess.run([sys.executable, "send.py", zk_connect, "orders"] + bodies, cwd=str(workdir),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    results = [line.split(" ", 3) for line in out.stdout.splitlines()]
    assert len(results) == 3 and all(r[0] == "True" for r in results), out.stdout  # SendResult.success
    # its round-robin selector over partitions 7-0, 7-1, 7-2 (sorted by its own comparator), its offsets parsed
    with zk_broker.client() as c:
        stored = {}
        for _success, partition, offset, _error in results:
            broker_id, part = partition.split("-")
            assert broker_id == "7"
            recs = c.get_records("orders", int(part), int(offset))
            stored[(int(part), int(offset))] = recs[0].payload
    assert sorted(stored.values()) == sorted(b.encode() for b in bodies)
    assert {p for p, _o in stored} == {0, 1, 2}  # one message on each partition: its selector went round
