"""The soft open-files limit a broker raises its own to at start (``limits.nofile_target_for``, applied by
``config.raise_nofile_limit``): its reserve plus its connection cap, or DEFAULT_CONNECTION_ROOM when the cap is
unset; never lowered, never past the hard limit; a refused raise is a warning and the broker goes on.

Unit tests: the decision on numbers, the raise with the process's limits stood in for (this process's own are
never changed). The real broker's raise: tests/integration/test_fd_budget.py."""

import logging
import os
import resource

import pytest

from metaq import limits
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.server.config import read_config, raise_nofile_limit

INF = resource.RLIM_INFINITY
PLAIN = limits.FD_RESERVE
CLUSTER = limits.fd_reserve_for(mqttcluster_limits.MQTT_CLUSTER_PEER_HEADROOM, mqttcluster_limits.MQTT_CLUSTER_LINK_FDS)
ROOM = limits.DEFAULT_CONNECTION_ROOM


@pytest.mark.parametrize("soft, hard, cap, target", [
    (1024, 1 << 20, None, PLAIN + ROOM),  # a login's soft limit, a high hard one: room for the default
    (PLAIN + ROOM, 1 << 20, None, PLAIN + ROOM),  # soft exactly enough: kept
    (PLAIN + ROOM - 1, 1 << 20, None, PLAIN + ROOM),  # one short: raised
    (PLAIN + ROOM + 1, 1 << 20, None, PLAIN + ROOM + 1),  # soft past it: never lowered
    (1024, 4096, None, 4096),  # hard below the target: up to the hard limit, no further
    (1024, PLAIN + ROOM, None, PLAIN + ROOM),  # hard exactly the target
    (1024, PLAIN + ROOM - 1, None, PLAIN + ROOM - 1),  # hard one short of it
    (1024, 1024, None, 1024),  # nothing to raise to
    (1024, INF, None, PLAIN + ROOM),  # no hard limit: the target itself
    (INF, INF, None, INF),  # no limit at all: kept
    (1024, 1 << 20, 2000, PLAIN + 2000),  # a configured cap: its room, not the default's
    (PLAIN + 500, 1 << 20, 500, PLAIN + 500),  # soft exactly the configured cap's: kept
    (PLAIN + 499, 1 << 20, 500, PLAIN + 500),  # one short
    (1024, 1 << 20, 100, 1024),  # soft already past a small cap's need: never lowered
])
def test_the_target_is_the_reserve_plus_the_cap_within_the_hard_limit_never_lower(soft, hard, cap, target):
    assert limits.nofile_target_for(soft, hard, PLAIN, cap) == target


def test_an_mqtt_cluster_broker_targets_its_own_reserve():
    cluster = read_config(None, {"mqtt.port": 1883, "zk.connect": "127.0.0.1:2181"})
    assert cluster.fd_reserve() == CLUSTER
    assert cluster.nofile_target(1024, 4096) == 4096
    assert cluster.nofile_target(1024, 1 << 20) == CLUSTER + ROOM
    capped = read_config(None, {"mqtt.port": 1883, "zk.connect": "127.0.0.1:2181", "limits.max_connections": 300})
    assert capped.nofile_target(1024, 1 << 20) == CLUSTER + 300


class FakeLimits:
    """RLIMIT_NOFILE as ``resource`` shows it, stood in for; ``refuse`` makes setrlimit fail as the kernel does."""

    def __init__(self, soft, hard, refuse=None):
        self.limits, self.refuse, self.calls = (soft, hard), refuse, []

    def getrlimit(self, which):
        assert which == resource.RLIMIT_NOFILE
        return self.limits

    def setrlimit(self, which, limits_):
        assert which == resource.RLIMIT_NOFILE
        self.calls.append(limits_)
        if self.refuse is not None:
            raise self.refuse
        self.limits = limits_


@pytest.fixture
def fake(monkeypatch):
    def make(soft, hard, refuse=None):
        f = FakeLimits(soft, hard, refuse)
        monkeypatch.setattr(resource, "getrlimit", f.getrlimit)
        monkeypatch.setattr(resource, "setrlimit", f.setrlimit)
        return f
    return make


def test_the_raise_sets_the_target_keeps_the_hard_limit_and_says_why(fake, caplog):
    f = fake(1024, 20000)
    with caplog.at_level(logging.INFO, "metaq.server.config"):
        assert raise_nofile_limit(read_config(None)) == PLAIN + ROOM
    assert f.calls == [(PLAIN + ROOM, 20000)]
    assert [r.levelname for r in caplog.records] == ["INFO"]
    assert "from 1024 to %d for %d descriptors kept back" % (PLAIN + ROOM, PLAIN) in caplog.text
    assert "limits.DEFAULT_CONNECTION_ROOM" in caplog.text


def test_at_the_hard_limit_the_line_says_so(fake, caplog):
    fake(1024, 4096)
    with caplog.at_level(logging.INFO, "metaq.server.config"):
        assert raise_nofile_limit(read_config(None, {"limits.max_connections": 5000})) == 4096
    assert "from 1024 to 4096 (the hard limit) for" in caplog.text and "limits.max_connections" in caplog.text


def test_a_soft_limit_already_enough_is_left_alone_without_a_word(fake, caplog):
    f = fake(PLAIN + ROOM, 1 << 20)
    with caplog.at_level(logging.INFO, "metaq.server.config"):
        assert raise_nofile_limit(read_config(None)) == PLAIN + ROOM
    assert f.calls == [] and caplog.records == []


@pytest.mark.parametrize("error", [PermissionError(1, "Operation not permitted"),
                                   ValueError("not allowed to raise maximum limit")])
def test_a_refused_raise_is_a_warning_and_the_broker_goes_on_with_what_it_has(fake, caplog, error):
    f = fake(1024, 20000, refuse=error)
    with caplog.at_level(logging.INFO, "metaq.server.config"):
        assert raise_nofile_limit(read_config(None)) == 1024
    assert f.limits == (1024, 20000)
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "cannot raise the open-files limit (ulimit -n) from 1024 to %d" % (PLAIN + ROOM) in caplog.text
    assert "going on with 1024" in caplog.text


def test_reading_a_file_raises_nothing(tmp_path, monkeypatch):
    """Only the broker's own start raises its limit: reading, validating and checking a file (``read_config``,
    ``load_config``, ``check_fd_limit``, the deploy agent's checksum of it) never touch the limits of the process
    that does it."""
    from metaq.deploy import agent
    from metaq.deploy.layout import Layout
    from metaq.server.config import check_fd_limit, load_config

    def setrlimit(*_args):
        raise AssertionError("a process reading a broker's file changed its open-files limit")

    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    layout = Layout(str(tmp_path / "install"))
    os.makedirs(os.path.dirname(layout.config))
    with open(layout.config, "w") as f:
        f.write("mqtt: {port: 1883}\nzk: {connect: '127.0.0.1:2181'}\n")
    config = read_config(layout.config)
    check_fd_limit(config, layout.config, nofile=config.fd_reserve() + 1)
    load_config(None)
    assert agent._config_crc(layout) == config.checksum()
