"""Fixtures that start real servers, and the two test tiers (README "Testing").

A test is ``integration`` when it lives in a folder of server tests or uses a fixture that starts a
server (``pytest_collection_modifyitems`` marks it); every other test is a unit test, and a unit test
that binds, listens on, connects or sends a datagram from a socket other than AF_UNIX fails (``_no_network_in_unit_tests``).
"""

import os
import socket

import pytest
from hypothesis import settings

from metaq.client.local import BrokerProcess

# No clock in assertions: Hypothesis's per-example deadline (200 ms) fails a correct test on a busy machine.
settings.register_profile("metaq", deadline=None)
settings.load_profile("metaq")


@pytest.fixture
def broker_factory(tmp_path):
    """Start real brokers; every one still running is stopped (by its own PID) at the end."""
    started = []

    def make(config=None, workdir=None, extra_args=(), start=True):
        wd = workdir or tmp_path / ("b%d" % len(started))
        os.makedirs(wd, exist_ok=True)
        b = BrokerProcess(wd, config, extra_args)
        started.append(b)
        return b.start() if start else b

    yield make
    for b in started:
        b.kill()


@pytest.fixture
def broker(broker_factory):
    return broker_factory()


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    """One real ZooKeeper for the whole run; tests isolate themselves with a chroot (``zk_connect``)."""
    from tests.harness.zookeeper import ZooKeeperProcess

    zk = ZooKeeperProcess(tmp_path_factory.mktemp("zk")).start()
    yield zk
    zk.stop()


@pytest.fixture
def zk_connect(zk_server):
    """``127.0.0.1:PORT/t-<random>``: a private namespace on the shared ZooKeeper."""
    return zk_server.chroot()


@pytest.fixture
def own_zk(tmp_path):
    """A ZooKeeper of this test's own, for tests that stop, kill or restart it."""
    from tests.harness.zookeeper import ZooKeeperProcess

    zk = ZooKeeperProcess(tmp_path / "zk").start()
    yield zk
    zk.kill()


@pytest.fixture(scope="session")
def pg_server():
    """One real PostgreSQL cluster for the whole run (``tests/harness/postgres.py``); tests get a database each."""
    from tests.harness.postgres import PostgresProcess

    pg = PostgresProcess().start()
    yield pg
    pg.cleanup()


@pytest.fixture
def pg_dsn(pg_server):
    """The DSN of a fresh database (from template0) on ``pg_server``; dropped afterwards with its prepared xacts."""
    name = pg_server.create_database()
    yield pg_server.dsn(name)
    pg_server.drop_database(name)


#: Folders whose tests all start servers (brokers, sshd, Spark, the official RocketMQ client, attacks on a broker).
INTEGRATION_DIRS = {"integration", "deploy", "remoting", "spark", "hostile", "security"}

#: Fixtures that start a server or a listening socket (directly or through the fixtures they use).
SERVER_FIXTURES = {"broker_factory", "broker", "zk_server", "zk_connect", "own_zk", "pg_server", "pg_dsn", "sshd",
                   "spark", "rmq_factory", "rmq_broker", "rc", "fake"}

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def is_integration(item):
    rel = os.path.relpath(str(item.path), TESTS_DIR).split(os.sep)
    return (len(rel) > 1 and rel[0] in INTEGRATION_DIRS) or bool(SERVER_FIXTURES.intersection(item.fixturenames))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_integration(item) and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)


#: The socket classes the guard covers: the stdlib's and gevent's (which does not subclass it).
GUARDED_SOCKET_CLASSES = [socket.socket]
try:
    from gevent._socketcommon import SocketMixin as _GeventSocket
except ImportError:  # gevent is a server dependency; without it there is nothing more to guard
    pass
else:
    GUARDED_SOCKET_CLASSES.append(_GeventSocket)

GUARDED_METHODS = ("bind", "listen", "connect", "connect_ex", "sendto")


def _refuse_network(cls, method_name):
    original = getattr(cls, method_name)

    def guarded(sock, *args, **kwargs):
        if sock.family != socket.AF_UNIX:
            raise AssertionError("a unit test may not %s a %r socket: mark it integration (pytest.mark.integration)"
                                 % (method_name, socket.AddressFamily(sock.family)))
        return original(sock, *args, **kwargs)

    return guarded


@pytest.fixture(autouse=True)
def _no_network_in_unit_tests(request, monkeypatch):
    """Unit tests open no network socket: bind, listen, connect, connect_ex and sendto fail unless AF_UNIX."""
    if request.node.get_closest_marker("integration") is None:
        for cls in GUARDED_SOCKET_CLASSES:
            for name in GUARDED_METHODS:
                monkeypatch.setattr(cls, name, _refuse_network(cls, name))
    yield
