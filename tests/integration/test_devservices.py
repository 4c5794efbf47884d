"""`make zookeeper` / `make postgres` and their stops (README "First run"): start, reach, stop by the PID."""

import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

from metaq.client.local import free_port
from tests.harness.zookeeper import four_letter

ROOT = pathlib.Path(__file__).resolve().parents[2]


def make(*args):
    out = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, (args, out.stdout, out.stderr)
    return out.stdout


def gone(pid):
    """The process has ended: no /proc entry, or a zombie its new parent (init) has not reaped yet."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def recorded_pid(devdata, name):
    return int((devdata / (name + ".pid")).read_text())


def test_make_zookeeper_starts_one_that_answers_and_stop_ends_its_pid(tmp_path):
    port, devdata = free_port(), tmp_path / "devdata"
    out = make("zookeeper", "ZK_PORT=%d" % port, "DEVDATA=%s" % devdata)
    pid = recorded_pid(devdata, "zookeeper")
    try:
        assert "stop it with: make stop-zookeeper ZK_PORT=%d DEVDATA=%s" % (port, devdata) in out
        assert four_letter("127.0.0.1", port, "ruok") == "imok"
        from kazoo.client import KazooClient

        zk = KazooClient(hosts="127.0.0.1:%d" % port)
        zk.start(timeout=15)
        zk.ensure_path("/meta/readme")
        assert zk.exists("/meta/readme")
        zk.stop()
        zk.close()
        assert "already runs (PID %d" % pid in make("zookeeper", "ZK_PORT=%d" % port, "DEVDATA=%s" % devdata)
    finally:
        out = make("stop-zookeeper", "ZK_PORT=%d" % port, "DEVDATA=%s" % devdata)
    assert "stopped (PID %d)" % pid in out
    assert gone(pid) and not (devdata / "zookeeper.pid").exists()
    assert four_letter("127.0.0.1", port, "ruok") == ""
    assert "not running" in make("stop-zookeeper", "ZK_PORT=%d" % port, "DEVDATA=%s" % devdata)


def test_make_postgres_gives_the_shop_database_with_two_phase_commit(tmp_path):
    psycopg = pytest.importorskip("psycopg")
    port, devdata = free_port(), tmp_path / "devdata"
    out = make("postgres", "PG_PORT=%d" % port, "DEVDATA=%s" % devdata)
    pid = recorded_pid(devdata, "postgres")
    try:
        assert 'psql "host=127.0.0.1 port=%d dbname=shop user=shop"' % port in out
        with psycopg.connect("host=127.0.0.1 port=%d dbname=shop user=shop" % port, autocommit=True) as conn:
            assert int(conn.execute("SHOW max_prepared_transactions").fetchone()[0]) > 0
            assert conn.execute("SELECT current_user").fetchone()[0] == "shop"
    finally:
        out = make("stop-postgres", "PG_PORT=%d" % port, "DEVDATA=%s" % devdata)
        shutil.rmtree(os.path.join(tempfile.gettempdir(), "metaq-devdata-postgres-%d" % port), ignore_errors=True)
    assert "stopped (PID %d)" % pid in out
    assert gone(pid) and not (devdata / "postgres.pid").exists()
