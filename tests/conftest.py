"""Fixtures that start real servers, and the two test tiers (README "Testing").

A test is ``integration`` when it lives in a folder of server tests or uses a fixture that starts a
server (``pytest_collection_modifyitems`` marks it); every other test is a unit test, and a unit test
that binds, listens on, connects or sends a datagram from a socket other than AF_UNIX fails
(``_no_network_in_unit_tests``).
"""

import os
import socket
import tempfile

import pytest
from hypothesis import settings

from metaq.client.local import BrokerProcess
from metaq import textcommands  # noqa: F401 - every text command declared: the tests parse and serialize any

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


#: What a full run may add to the disk: its peak measured 2.2 GB on 2026-11-24 (df sampled every 10 s through a
#: ``make test`` of a fresh clone, its virtualenv included), with room for the brokers' preallocated segments.
SUITE_PEAK_BYTES = 6 << 30


def disk_verdict(usage, danger_ratio, peak_bytes=SUITE_PEAK_BYTES):
    """``(refuse, message)`` for the disk the tests write to: brokers refuse puts above ``danger_ratio``, so a run
    that starts there fails hundreds of tests for one reason; one that would cross it on the way is warned about."""
    if usage.ratio >= danger_ratio:
        return True, ("the disk holding %s is %.1f%% full, above the brokers' danger mark %.0f%%: every put would be "
                      "refused (507). Free %.1f GiB or point TMPDIR at another disk."
                      % (tempfile.gettempdir(), usage.ratio * 100, danger_ratio * 100,
                         _bytes_to_free(usage, danger_ratio, peak_bytes) / (1 << 30)))
    if usage.ratio_after(peak_bytes) >= danger_ratio:
        return False, ("the disk holding %s is %.1f%% full; a full run adds up to %.0f GiB and may cross the brokers' "
                       "danger mark %.0f%%" % (tempfile.gettempdir(), usage.ratio * 100, peak_bytes / (1 << 30),
                                               danger_ratio * 100))
    return False, None


def _bytes_to_free(usage, danger_ratio, peak_bytes):
    """How much must go for a full run to stay below ``danger_ratio`` (``DiskUsage.ratio_after`` solved for it)."""
    return max(0, (usage.ratio_after(peak_bytes) - danger_ratio) * (usage.used_bytes + usage.available_bytes))


def _disk_verdict_here():
    from metaq.store.config import StoreConfig
    from metaq.store.files import disk_usage

    return disk_verdict(disk_usage(tempfile.gettempdir()), StoreConfig(tempfile.gettempdir()).disk_danger_ratio)


def pytest_sessionstart(session):
    refuse, message = _disk_verdict_here()
    if refuse:
        pytest.exit(message, returncode=pytest.ExitCode.USAGE_ERROR)


def pytest_report_header(config):
    return "disk: " + (_disk_verdict_here()[1] or "room for a full run")


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
