"""The fault injectors (tests/harness/faults.py) on real processes and sockets, and the FaultPlan's draw.

The plan's tests are unit tests; the others start processes or listen, and are marked ``integration``
(explicitly where no server fixture does it, so that this folder's pure tests stay in the unit tier)."""

import socket
import threading
import time

import pytest

from metaq.client.local import free_port, small_config
from tests.harness.broker import wait_for
from tests.harness.faults import (ALL_KINDS, KINDS, SEED_ENV, FaultPlan, KillBroker, LinkProxy, PauseProcess,
                                  RestartZooKeeper, StopBroker)
from tests.harness.replication import caught_up, master_config, mixed_load, stats
from tests.harness.zookeeper import four_letter


# -- FaultPlan (unit) ----------------------------------------------------------------------------------------------

def test_a_seed_draws_the_same_plan_and_another_seed_another(monkeypatch):
    monkeypatch.delenv(SEED_ENV, raising=False)
    a, b = FaultPlan(seed=42, rounds=20), FaultPlan(seed=42, rounds=20)
    assert a.steps == b.steps and a.seed == 42
    assert FaultPlan(seed=43, rounds=20).steps != a.steps
    assert {s.kind for s in a} <= set(KINDS) and len(a) == 20 and [s.round for s in a] == list(range(1, 21))
    assert all(0.5 <= s.seconds <= 8.0 and 1.0 <= s.wait <= 3.0 for s in a)
    assert "fault plan METAQ_CHECKER_SEED=42, 20 rounds:\n  round 1: " in a.describe()


def test_the_environment_overrides_the_seed(monkeypatch):
    monkeypatch.setenv(SEED_ENV, "7")
    plan = FaultPlan(seed=42, rounds=3)
    assert plan.seed == 7
    monkeypatch.delenv(SEED_ENV)
    assert FaultPlan(seed=7, rounds=3).steps == plan.steps
    unseeded = FaultPlan(rounds=3)
    assert isinstance(unseeded.seed, int) and FaultPlan(seed=unseeded.seed, rounds=3).steps == unseeded.steps


def test_kinds_and_durations_are_honoured(monkeypatch):
    monkeypatch.delenv(SEED_ENV, raising=False)
    plan = FaultPlan(seed=1, rounds=30, kinds=["pause_master", "cut_link"], durations={"pause_master": (6.0, 7.0)},
                     waits=(0.0, 0.0))
    assert {s.kind for s in plan} == {"pause_master", "cut_link"}
    assert all(6.0 <= s.seconds <= 7.0 for s in plan if s.kind == "pause_master")
    assert all(s.wait == 0.0 for s in plan)


def test_a_clean_stop_is_drawn_only_when_asked_for(monkeypatch):
    monkeypatch.delenv(SEED_ENV, raising=False)
    assert "stop_master" not in KINDS and "stop_master" not in {s.kind for s in FaultPlan(seed=5, rounds=50)}
    plan = FaultPlan(seed=5, rounds=50, kinds=ALL_KINDS)
    assert {s.kind for s in plan} == set(ALL_KINDS)
    assert all(0.5 <= s.seconds <= 3.0 for s in plan if s.kind == "stop_master")


def test_every_failure_message_carries_the_seed(monkeypatch):
    monkeypatch.delenv(SEED_ENV, raising=False)
    plan = FaultPlan(seed=99, rounds=1)
    assert plan.message("lost m1").endswith("[reproduce with METAQ_CHECKER_SEED=99]")
    with pytest.raises(AssertionError, match=r"(?s)2 violations.*METAQ_CHECKER_SEED=99"):
        with plan.reported():
            raise AssertionError("2 violations")


@pytest.mark.parametrize("kwargs, env, match", [
    ({"rounds": 0}, None, r"rounds must be an int in 1..1000, got 0"),
    ({"rounds": True}, None, r"rounds must be an int"),
    ({"kinds": ["kill_master", "explode"]}, None, r"kinds must be distinct names among kill_master, .*'explode'"),
    ({"kinds": []}, None, r"kinds must be distinct names"),
    ({"kinds": ["cut_link", "cut_link"]}, None, r"kinds must be distinct names"),
    ({"durations": {"nap": (1, 2)}}, None, r"durations: unknown kind 'nap'"),
    ({"durations": {"cut_link": (3, 1)}}, None, r"cut_link must be \(low, high\) seconds"),
    ({"waits": (-1, 1)}, None, r"waits must be \(low, high\) seconds"),
    ({"seed": "abc"}, None, r"seed must be an int, got 'abc'"),
    ({}, "twelve", r"METAQ_CHECKER_SEED must be an integer seed, got 'twelve'"),
])
def test_a_bad_plan_is_refused(monkeypatch, kwargs, env, match):
    if env is None:
        monkeypatch.delenv(SEED_ENV, raising=False)
    else:
        monkeypatch.setenv(SEED_ENV, env)
    with pytest.raises(ValueError, match=match):
        FaultPlan(**kwargs)


def test_a_pause_longer_than_the_limit_is_refused():
    with pytest.raises(ValueError, match=r"pause seconds must be in \(0, 300.0\], got 301"):
        PauseProcess(object()).inject(301)


# -- LinkProxy over a plain echo server ----------------------------------------------------------------------------

class Echo:
    """An echo server thread: what a connection sends comes back."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn):
        with conn:
            while True:
                try:
                    data = conn.recv(4096)
                except OSError:
                    return
                if not data:
                    return
                conn.sendall(data)


def echo_once(port, data=b"ping", timeout=2.0):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        return s.recv(4096)


def closed_by_peer(sock, timeout=2.0):
    sock.settimeout(timeout)
    try:
        return sock.recv(10) == b""
    except ConnectionResetError:
        return True


@pytest.mark.integration
def test_a_cut_link_drops_connections_and_refuses_new_ones_until_healed():
    echo = Echo()
    with LinkProxy(("127.0.0.1", echo.port)) as proxy:
        assert echo_once(proxy.port) == b"ping"
        live = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        live.sendall(b"a")
        assert live.recv(10) == b"a"
        wait_for(lambda: proxy.connections() == 1, 5, "the live connection relayed")
        proxy.cut()
        assert closed_by_peer(live)
        late = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)  # accepted, then closed at once
        assert closed_by_peer(late)
        wait_for(lambda: proxy.refused >= 1, 5, "a refused connection counted")
        proxy.heal()
        assert echo_once(proxy.port, b"again") == b"again"
        assert proxy.relayed == 3 and proxy.connections() <= 1
        live.close()
        late.close()


@pytest.mark.integration
def test_a_blackholed_link_stays_open_and_silent_until_healed():
    echo = Echo()
    with LinkProxy(("127.0.0.1", echo.port)) as proxy:
        live = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        live.sendall(b"a")
        assert live.recv(10) == b"a"
        proxy.cut(blackhole=True)
        live.sendall(b"lost")
        live.settimeout(0.5)
        with pytest.raises(socket.timeout):
            live.recv(10)  # neither closed nor answered: a silent partition
        new = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        new.sendall(b"x")
        new.settimeout(0.5)
        with pytest.raises(socket.timeout):
            new.recv(10)
        wait_for(lambda: proxy.held == 1, 5, "the new connection held")
        proxy.heal()
        assert closed_by_peer(live) and closed_by_peer(new)  # their streams lost bytes: closed, not resumed
        assert echo_once(proxy.port) == b"ping"
        live.close()
        new.close()


# -- on real brokers and a real ZooKeeper --------------------------------------------------------------------------

@pytest.mark.fault
def test_a_cut_replication_link_stops_the_slave_until_healed(broker_factory, tmp_path):
    rport = free_port()
    master = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    with LinkProxy(("127.0.0.1", rport)) as proxy:
        slave = broker_factory(small_config(str(tmp_path / "s" / "data")), workdir=tmp_path / "s",
                               extra_args=["--slave-of", proxy.address, "--slave-id", "1"])
        mixed_load(master, 20, seed=3)
        caught_up(master, slave)
        proxy.cut()
        wait_for(lambda: stats(slave)["replication_link"] == "down", 10, "the slave sees its link down")
        mixed_load(master, 20, seed=4)
        time.sleep(0.5)
        assert int(stats(slave)["total_messages"]) == 20 < int(stats(master)["total_messages"])
        proxy.heal()
        caught_up(master, slave)
        assert stats(slave)["replication_link"] == "connected" and int(stats(slave)["total_messages"]) == 40


@pytest.mark.fault
def test_kill_and_restart_of_a_broker_by_its_pid(broker_factory):
    broker = broker_factory()
    with broker.client() as c:
        c.put_ok("t-a", b"before", partition=0)
    fault = KillBroker(broker)
    t = fault.inject()
    assert broker.proc.returncode == -9 and t <= time.monotonic()
    with pytest.raises(RuntimeError, match="is not running"):
        fault.inject()
    fault.heal()
    with broker.client() as c:
        assert [r.data for r in c.get_records("t-a", 0, 0)] == [b"before"]


@pytest.mark.fault
def test_a_clean_stop_and_restart_of_a_broker_by_its_pid(broker_factory):
    broker = broker_factory()
    with broker.client() as c:
        c.put_ok("t-a", b"before", partition=0)
    fault = StopBroker(broker)
    before = time.monotonic()
    t = fault.inject()
    assert broker.proc.returncode == 0 and before <= t <= time.monotonic()
    assert "broker stopped cleanly" in broker.log_text()
    with pytest.raises(RuntimeError, match="SIGTERM: .* is not running"):
        fault.inject()
    fault.heal()
    with broker.client() as c:
        assert [r.data for r in c.get_records("t-a", 0, 0)] == [b"before"]


@pytest.mark.fault
def test_a_paused_broker_answers_nothing_until_it_is_continued(broker_factory):
    broker = broker_factory()
    pause = PauseProcess(broker)
    try:
        pause.inject(1.5)
        with pytest.raises(RuntimeError, match="already paused"):
            pause.inject()
        started = time.monotonic()
        with broker.client(timeout=0.5) as c:
            with pytest.raises(socket.timeout):
                c.stats()
        assert pause.wait_resumed(5)  # the timer sent SIGCONT
        assert time.monotonic() - started >= 1.0
        with broker.client() as c:
            assert c.stats_dict()["pid"] == str(broker.proc.pid)
        pause.inject()
        pause.heal()
        pause.heal()  # twice is harmless
        with broker.client(timeout=2) as c:
            c.stats()
    finally:
        pause.close()


@pytest.mark.fault
def test_a_zookeeper_restart_keeps_its_port_and_data(own_zk):
    from kazoo.client import KazooClient

    kz = KazooClient(hosts=own_zk.connect)
    kz.start(15)
    kz.create("/kept", b"v")
    kz.stop()
    kz.close()
    fault = RestartZooKeeper(own_zk)
    fault.inject(kill=True)
    assert four_letter("127.0.0.1", own_zk.port, "ruok") == ""
    fault.heal()
    assert "Mode:" in four_letter("127.0.0.1", own_zk.port, "srvr")
    kz = KazooClient(hosts=own_zk.connect)
    kz.start(15)
    try:
        assert kz.get("/kept")[0] == b"v"
    finally:
        kz.stop()
        kz.close()
