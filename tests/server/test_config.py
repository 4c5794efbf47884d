"""The configuration schema: one default per setting, the store's and tx's configs built from it, documented."""

import dataclasses
import inspect
import pathlib
import re

import pytest
import yaml

from metaq.rmq5 import limits as rmq5_limits
from metaq.errors import ConfigError
from metaq.server.config import ServerConfig, load_config
from metaq.store.config import StoreConfig
from metaq.transactions.config import TxConfig

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
#: StoreConfig fields the server fills from other sections (broker.data_dir, broker.id, topics, delay, remoting,
#: limits.max_topics, limits.max_partitions).
STORE_FROM_ELSEWHERE = {"data_dir", "broker_id", "topics", "max_topics", "max_partitions"}
SECTIONS = [name for name in ServerConfig.model_fields if name != "topics"]


def test_every_store_knob_is_a_store_setting_with_the_store_default():
    section = ServerConfig.model_fields["store"].annotation
    for f in dataclasses.fields(StoreConfig):
        if f.name in STORE_FROM_ELSEWHERE:
            continue
        assert f.name in section.model_fields, "StoreConfig.%s is not configurable under store:" % f.name
        assert section.model_fields[f.name].default == f.default, f.name


def test_every_tx_setting_is_a_transactions_setting_with_the_tx_default():
    section = ServerConfig.model_fields["transactions"].annotation
    assert set(inspect.signature(TxConfig).parameters) <= set(section.model_fields)
    assert load_config(None).tx_config() == TxConfig()


def test_store_and_tx_configs_carry_every_setting(tmp_path):
    store = {"segment_size": 8 << 20, "index_file_units": 128, "flush": "async", "flush_every_messages": 7,
             "flush_interval_ms": 8, "checkpoint_interval_ms": 90, "retention_hours": 2.5, "disk_warn_ratio": 0.5,
             "disk_danger_ratio": 0.6, "max_transfer_size": 4096, "force_recovery": True}
    tx = {"max_timeout_s": 30, "default_timeout_s": 20, "journal_flush": "os", "journal_file_size": 1 << 20,
          "max_puts_per_tx": 5, "max_tx_bytes": 2048}
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"broker": {"id": 9, "data_dir": str(tmp_path / "d")}, "store": store,
                                 "transactions": tx}))
    c = load_config(str(f))
    sc = c.store_config()
    assert {k: getattr(sc, k) for k in store} == store
    assert (sc.broker_id, sc.data_dir) == (9, str(tmp_path / "d"))
    assert c.tx_config() == TxConfig(**tx)


def test_topic_limits_reach_the_store(tmp_path):
    from metaq.topics import limits as topics_limits

    assert (load_config(None).store_config().max_topics, load_config(None).store_config().max_partitions) == (
        topics_limits.MAX_TOPICS, topics_limits.MAX_TOTAL_PARTITIONS)
    c = load_config(None, {"broker.data_dir": str(tmp_path), "limits.max_topics": 7, "limits.max_partitions": 9})
    assert (c.store_config().max_topics, c.store_config().max_partitions) == (7, 9)
    for key in ("limits.max_topics", "limits.max_partitions"):
        with pytest.raises(ConfigError, match=key):
            load_config(None, {key: 0})


#: What conf/server.yaml sets on purpose to other than the default: the HTTP and MQTT ports, off by default, are on
#: for the loopback broker `make run` starts (README "The HTTP port", docs/mqtt.md); the segment and key index sizes
#: fit a laptop (a new data directory takes about 70 MB instead of 1.1 GB).
SHIPPED_ON_PURPOSE = {("http", "port"): 8180, ("mqtt", "port"): 1883, ("store", "segment_size"): 64 << 20,
                      ("store", "key_index_slots"): 1 << 16, ("store", "key_index_entries"): 1 << 17}


@pytest.mark.parametrize("section", SECTIONS)
def test_shipped_config_documents_every_setting_with_its_default(section):
    with open(ROOT / "conf" / "server.yaml") as f:
        shipped = yaml.safe_load(f)
    defaults = getattr(ServerConfig(), section).model_dump()
    for (name, key), value in SHIPPED_ON_PURPOSE.items():
        if name == section:
            assert defaults[key] != value
            defaults[key] = value
    assert shipped.get(section) == defaults


def test_settings_named_in_the_documentation_exist():
    pages = [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "architecture.md"]  # that one names modules
    text = "\n".join(p.read_text() for p in [ROOT / "README.md"] + pages)
    named = set(re.findall(r"`(%s)\.(?!(?:py|log)`)(\w+)`" % "|".join(SECTIONS), text))  # not a file (`store.py`)
    assert named
    for section, key in named:
        assert key in ServerConfig.model_fields[section].annotation.model_fields, \
            "the documentation names %s.%s" % (section, key)


def test_the_http_port_is_off_by_default_and_checked_like_the_others():
    assert load_config(None).http.port is None
    c = load_config(None, {"http.port": 8180})
    assert (c.http.port, c.http.host) == (8180, None)
    with pytest.raises(ConfigError, match="http.port"):
        load_config(None, {"http.port": 8123})  # broker.port's
    with pytest.raises(ConfigError, match="http.host 0.0.0.0"):
        load_config(None, {"http.port": 8180, "http.host": "0.0.0.0"})  # authentication off: loopback only
    assert load_config(None, {"http.port": 8180, "http.host": "0.0.0.0", "security.insecure": True}).http.port == 8180


def test_the_grpc_port_is_off_by_default_and_checked_like_the_others():
    c = load_config(None)
    assert c.grpc.port is None and c.grpc.max_streams_per_connection == rmq5_limits.GRPC_MAX_STREAMS_PER_CONNECTION
    assert (c.grpc.max_message_bytes, c.grpc.max_header_bytes) == (rmq5_limits.GRPC_MAX_MESSAGE_BYTES,
                                                                   rmq5_limits.GRPC_MAX_HEADER_BYTES)
    assert load_config(None, {"grpc.port": 8081}).grpc.port == 8081
    with pytest.raises(ConfigError, match="http.port and grpc.port are both 127.0.0.1:8081"):
        load_config(None, {"grpc.port": 8081, "http.port": 8081})
    with pytest.raises(ConfigError, match="grpc.host 0.0.0.0"):
        load_config(None, {"grpc.port": 8081, "grpc.host": "0.0.0.0"})  # authentication off: loopback only
    assert load_config(None, {"grpc.port": 8081, "grpc.host": "0.0.0.0", "security.insecure": True}).grpc.port
    with pytest.raises(ConfigError, match="grpc.max_message_bytes .* must hold a body of limits.max_body_bytes"):
        load_config(None, {"grpc.port": 8081, "limits.max_body_bytes": 8 << 20})
    assert load_config(None, {"grpc.port": 8081, "limits.max_body_bytes": 8 << 20,
                              "grpc.max_message_bytes": (8 << 20) + (64 << 10), "store.segment_size": 64 << 20})
    assert load_config(None, {"limits.max_body_bytes": 8 << 20, "store.segment_size": 64 << 20})  # port off
    for key, bad in (("grpc.max_streams_per_connection", 0), ("grpc.max_message_bytes", 1023),
                     ("grpc.max_header_bytes", 1023), ("grpc.max_call_s", 0), ("grpc.host", " ")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(None, {key: bad})


def test_http_basic_in_clear_off_loopback_is_refused_unless_insecure(tmp_path):
    authed = {"security.acl_file": str(tmp_path / "acl.yaml"), "broker.host": "0.0.0.0", "http.port": 8180}
    with pytest.raises(ConfigError, match="http.port listens on 0.0.0.0, not a loopback address, with "
                                          "authentication on and TLS off: HTTP Basic"):
        load_config(None, authed)
    assert load_config(None, dict(authed, **{"http.host": "127.0.0.1"})).http.host == "127.0.0.1"
    assert load_config(None, dict(authed, **{"security.insecure": True})).http.port == 8180
    tls = {"security.tls.mode": "on", "security.tls.cert": "c.pem", "security.tls.key": "k.pem"}
    assert load_config(None, dict(authed, **tls)).security.tls.mode == "on"
    assert load_config(None, dict(authed, **{"http.port": None})).http.port is None  # no HTTP port: nothing sent


def test_an_mqtt_password_in_clear_off_loopback_is_refused_unless_insecure(tmp_path):
    authed = {"security.acl_file": str(tmp_path / "acl.yaml"), "broker.host": "0.0.0.0", "mqtt.port": 1883}
    with pytest.raises(ConfigError, match="mqtt.port listens on 0.0.0.0, not a loopback address, with "
                                          "authentication on and TLS off"):
        load_config(None, authed)
    assert load_config(None, dict(authed, **{"mqtt.host": "127.0.0.1"})).mqtt.host == "127.0.0.1"
    assert load_config(None, dict(authed, **{"security.insecure": True})).mqtt.port == 1883
    tls = {"security.tls.mode": "on", "security.tls.cert": "c.pem", "security.tls.key": "k.pem"}
    assert load_config(None, dict(authed, **tls)).security.tls.mode == "on"
    with pytest.raises(ConfigError, match="mqtt.host 0.0.0.0"):  # authentication off: loopback only
        load_config(None, {"mqtt.port": 1883, "mqtt.host": "0.0.0.0"})
    with pytest.raises(ConfigError, match="each listener needs its own port"):
        load_config(None, {"mqtt.port": 8123})  # broker.port's
    assert load_config(None).mqtt.port is None  # off unless configured


def test_any_host_name_without_authentication_is_refused_unless_insecure():
    with pytest.raises(ConfigError, match=r'http.allowed_hosts: \["\*"\] with authentication off .*DNS rebinding'):
        load_config(None, {"http.port": 8180, "http.allowed_hosts": ["*"]})
    assert load_config(None, {"http.port": 8180, "http.allowed_hosts": ["metaq.example"]}).http.allowed_hosts
    assert load_config(None, {"http.port": 8180, "http.allowed_hosts": ["*"], "security.insecure": True})


def test_shipped_topics_end_with_the_default_pattern():
    with open(ROOT / "conf" / "server.yaml") as f:
        shipped = yaml.safe_load(f)
    default = [t.model_dump() for t in ServerConfig().topics]
    assert shipped["topics"][-len(default):] == default


# -- replication.ha (issue 17) ------------------------------------------------------------------------

HA = {"replication.ha": "auto", "replication.port": 8124, "replication.slave_id": 1, "zk.connect": "127.0.0.1:2181"}


def test_ha_auto_with_everything_it_needs_and_its_defaults():
    c = load_config(None, dict(HA))
    assert c.replication.ha == "auto" and c.lease_ms() == c.zk.session_timeout_ms // 2
    assert load_config(None, dict(HA, **{"replication.lease_ms": 1000})).lease_ms() == 1000
    assert load_config(None).replication.ha == "manual"


@pytest.mark.parametrize("change, message", [
    ({"zk.connect": None}, "set zk.connect"),
    ({"replication.port": None}, "needs a replication port"),
    ({"replication.slave_id": None}, "slave_id"),
    ({"replication.role": "slave", "replication.slave_of": "127.0.0.1:9"}, "remove role/slave_of"),
    ({"replication.lease_ms": 30000}, "lease_ms \\(30000\\) must be below zk.session_timeout_ms \\(30000\\)"),
    ({"replication.insync_lag_ms": 60001}, "insync_lag_ms"),
    ({"replication.ha": "magic"}, "replication.ha"),
])
def test_ha_auto_refusals(change, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, dict(HA, **change))


def test_insync_lag_at_its_limit():
    assert load_config(None, dict(HA, **{"replication.insync_lag_ms": 60000})).replication.insync_lag_ms == 60000
