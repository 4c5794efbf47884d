import os

import pytest

from metaq.client.local import BrokerProcess


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
