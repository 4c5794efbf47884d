"""A deployed broker's systemd unit (metaq/deploy/units.py): what runs, as whom, with which open-files limit."""

from metaq import limits
from metaq.deploy import units
from metaq.deploy.layout import Layout
from metaq.server.config import ServerConfig


def _config(**sections):
    return ServerConfig.model_validate(dict({"broker": {"id": 0, "data_dir": "/var/lib/metaq"}}, **sections))


def test_the_unit_runs_the_current_release_as_the_deploying_user_restarted_and_started_at_boot():
    text = units.unit_text(Layout("/opt/metaq/b0"), "b0", "fleet", "deploy", 20512)
    lines = text.splitlines()
    for line in ("User=deploy", "WorkingDirectory=/opt/metaq/b0",
                 "ExecStart=/opt/metaq/b0/current/venv/bin/metaq-server -c /opt/metaq/b0/conf/server.yaml",
                 "Restart=on-failure", "LimitNOFILE=20512", "StandardOutput=append:/opt/metaq/b0/log/metaq.log",
                 "WantedBy=multi-user.target", "TimeoutStopSec=%d" % units.STOP_TIMEOUT_SEC):
        assert line in lines, text
    assert units.unit_name("b0") == "metaq-b0.service"
    assert units.installed_path("b0") == "/etc/systemd/system/metaq-b0.service"


def test_the_open_files_limit_is_the_brokers_reserve_plus_its_connection_cap():
    plain = _config()
    assert units.nofile(plain) == plain.fd_reserve() + limits.DEFAULT_CONNECTION_ROOM
    capped = _config(limits={"max_connections": 50_000})
    assert units.nofile(capped) == capped.fd_reserve() + 50_000
    clustered = _config(mqtt={"port": 1883}, zk={"connect": "zk:2181"}, replication={"port": 8124})
    assert clustered.fd_reserve() > plain.fd_reserve()
    assert units.nofile(clustered) == clustered.fd_reserve() + limits.DEFAULT_CONNECTION_ROOM
