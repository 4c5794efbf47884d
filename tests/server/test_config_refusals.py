"""Settings that used to be taken silently are refused, each with a message that names the place.

Unit tests: files in tmp_path and load_config, no broker, no network. The same messages reach a
user of ``metaq-server -c FILE`` as one line on stderr (tests/integration/test_config_cli.py).
"""

import resource
import textwrap

import pytest
import yaml

from metaq import limits
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.errors import ConfigError
from metaq.server.config import check_fd_limit, load_config


def write(tmp_path, text):
    f = tmp_path / "server.yaml"
    f.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(f)


def refusal(path, overrides=None):
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    message = str(info.value)
    assert "\n" not in message  # one line for the CLI to print
    return message


def test_a_key_written_twice_is_refused_naming_file_and_both_lines(tmp_path):
    path = write(tmp_path, """
        broker:
          port: 9001
          id: 3
          port: 9002
    """)
    message = refusal(path)
    assert message.startswith("configuration file %s, line 4:" % path)
    assert "'port'" in message and "first at line 2" in message


def test_a_section_written_twice_is_refused(tmp_path):
    path = write(tmp_path, """
        store: {flush: async}
        limits: {max_wait_ms: 100}
        store: {flush: sync}
    """)
    assert "line 3: key 'store'" in refusal(path)


def test_a_merge_may_still_override_what_it_brings(tmp_path):
    path = write(tmp_path, """
        broker:
          <<: {port: 9001, id: 3}
          port: 9002
    """)
    c = load_config(path)
    assert (c.broker.port, c.broker.id) == (9002, 3)


def test_a_topic_listed_twice_is_refused_naming_the_topic_and_both_entries(tmp_path):
    path = write(tmp_path, """
        topics:
          - {name: orders, partitions: 4}
          - {name: "t*", partitions: 2}
          - {name: orders, partitions: 8}
    """)
    message = refusal(path)
    assert "topic 'orders' is listed twice" in message
    assert "topics.0 (partitions 4)" in message and "topics.2 (partitions 8)" in message


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_data_dir_is_refused(tmp_path, value):
    path = write(tmp_path, "broker: {data_dir: %r}\n" % value)
    message = refusal(path)
    assert "broker.data_dir: must not be empty" in message and "write . for that" in message
    assert "broker.data_dir" in refusal(None, {"broker.data_dir": ""})  # --data-dir "" as well


def test_the_current_directory_written_as_dot_is_taken(tmp_path):
    assert load_config(write(tmp_path, "broker: {data_dir: .}\n")).broker.data_dir == "."


def test_max_connections_above_the_open_files_limit_is_refused_naming_the_limit(tmp_path):
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    most = soft - limits.FD_RESERVE
    message = refusal(write(tmp_path, "limits: {max_connections: 1000000000}\n"))
    assert "limits.max_connections is 1000000000" in message
    assert "open-files limit (ulimit -n) is %d" % soft in message and "at most %d" % most in message
    if most >= 1:
        assert load_config(write(tmp_path, "limits: {max_connections: %d}\n" % most)).max_connections() == most


def test_the_fd_check_uses_the_limit_it_is_given():
    config = load_config(None, {"limits.max_connections": 1000})
    check_fd_limit(config, nofile=1000 + limits.FD_RESERVE)
    with pytest.raises(ConfigError, match=r"at most 999\b"):
        check_fd_limit(config, nofile=999 + limits.FD_RESERVE)
    check_fd_limit(load_config(None), nofile=limits.FD_RESERVE + 1)  # unset: it follows the limit, one at least
    with pytest.raises(ConfigError, match=r"at least %d\b" % (limits.FD_RESERVE + 1)):
        check_fd_limit(load_config(None), nofile=limits.FD_RESERVE)


def test_an_mqtt_cluster_broker_keeps_its_peer_links_out_of_the_limit_too():
    """With an MQTT port and ZooKeeper a broker's replication port takes its peers' links in past the cap
    (MQTT_CLUSTER_PEER_HEADROOM) and it keeps those and its own links out (MQTT_CLUSTER_LINK_FDS) back from the
    limit: its default cap is that much lower, and a limit one short of them plus its cap is refused naming each."""
    cluster = load_config(None, {"mqtt.port": 1883, "zk.connect": "127.0.0.1:2181", "limits.max_connections": 1000})
    alone = load_config(None, {"mqtt.port": 1883})
    headroom = limits.REPLICATION_HEADROOM + mqttcluster_limits.MQTT_CLUSTER_PEER_HEADROOM
    per_peer = 1 + mqttcluster_limits.MQTT_CLUSTER_PEER_CONNECTIONS  # a follow link and the call links
    assert mqttcluster_limits.MQTT_CLUSTER_PEER_HEADROOM == per_peer * mqttcluster_limits.MQTT_CLUSTER_MAX_PEERS
    assert cluster.replication_headroom() == headroom and alone.replication_headroom() == limits.REPLICATION_HEADROOM
    reserve = limits.FD_STORE_RESERVE + headroom + mqttcluster_limits.MQTT_CLUSTER_LINK_FDS
    assert cluster.fd_reserve() == reserve and alone.fd_reserve() == limits.FD_RESERVE
    check_fd_limit(cluster, nofile=reserve + 1000)
    with pytest.raises(ConfigError, match=r"the replication port's 64 \(limits.REPLICATION_HEADROOM\), the MQTT "
                       r"cluster's peers' links in 320 \(limits.MQTT_CLUSTER_PEER_HEADROOM\) and its links out 320 "
                       r"\(limits.MQTT_CLUSTER_LINK_FDS\).*at most 999\b"):
        check_fd_limit(cluster, nofile=reserve + 999)
    unset = load_config(None, {"mqtt.port": 1883, "zk.connect": "127.0.0.1:2181"})
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert unset.max_connections() == max(1, soft - reserve)
    check_fd_limit(unset, nofile=reserve + 1)
    with pytest.raises(ConfigError, match=r"at least %d\b" % (reserve + 1)):
        check_fd_limit(unset, nofile=reserve)


@pytest.mark.parametrize("content, words", [
    ({"broker": {"id": True}}, "broker.id: Input should be a valid integer"),  # not broker 1
    ({"broker": {"port": "8123"}}, "broker.port: Input should be a valid integer"),
    ({"broker": {"burst_puts": "no"}}, "broker.burst_puts"),  # a string, not false
    ({"broker": {"host": ""}}, "broker.host: must not be empty"),  # would bind every interface
    ({"remoting": {"port": 9876, "host": ""}}, "remoting.host: must not be empty"),
    ({"remoting": {"cluster": ""}}, "remoting.cluster: must not be empty"),
    ({"remoting": {"broker_name": " "}}, "remoting.broker_name: must not be empty"),
    ({"store": {"retention_hours": float("inf")}}, "store.retention_hours: Input should be a finite number"),
    ({"limits": {"idle_timeout_s": float("inf")}}, "limits.idle_timeout_s"),
    ({"limits": {"request_timeout_s": float("nan")}}, "limits.request_timeout_s"),
    ({"broker": {"port": 9000}, "remoting": {"port": 9000}}, "broker.port and remoting.port are both 127.0.0.1:9000"),
    ({"replication": {"port": 8123}}, "broker.port and replication.port are both 127.0.0.1:8123"),
    ({"replication": {"port": 8124, "advertised_address": "proxy"}},
     "replication.advertised_address: expected HOST:PORT of a replication port, got 'proxy'"),
    ({"replication": {"port": 8124, "advertised_address": "proxy:0"}}, "got 'proxy:0'"),
    ({"replication": {"slave_of": "m1", "slave_id": 1, "role": "slave"}},
     "replication.slave_of: expected HOST:PORT of a replication port, got 'm1'"),
    ({"replication": {"advertised_address": "proxy:9000"}},
     "replication.advertised_address: where other members reach our replication port: set replication.port too"),
])
def test_values_that_used_to_be_taken_silently_are_refused(tmp_path, content, words):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(content))
    assert words in refusal(str(f))


def test_distinct_listeners_and_a_remoting_port_on_another_address_are_taken():
    c = load_config(None, {"remoting.port": 8123, "remoting.host": "127.0.0.2", "replication.port": 8124})
    assert (c.broker.port, c.remoting.port, c.replication.port) == (8123, 8123, 8124)


def test_two_listeners_on_one_address_and_port_are_refused():
    """README "Configuration": two listeners on one address and port are refused (not left to fail at bind)."""
    for overrides in ({"remoting.port": 8123}, {"replication.port": 8123},
                      {"remoting.port": 9876, "replication.port": 9876}):
        with pytest.raises(ConfigError, match="each listener needs its own port"):
            load_config(None, overrides)


def test_a_yaml_error_is_one_line_with_line_and_column(tmp_path):
    message = refusal(write(tmp_path, "broker: [unclosed\n"))
    assert message.startswith("configuration file %s is not valid YAML: line 2, column 1:" % (tmp_path / "server.yaml"))


def test_every_problem_of_a_file_is_listed_on_one_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump({"broker": {"id": 5000, "prot": 1}}))
    message = refusal(str(f))
    assert "broker.id:" in message and "; broker.prot: unknown setting; did you mean `port`?" in message


def test_a_misspelt_setting_names_the_nearest_valid_one(tmp_path):
    message = refusal(write(tmp_path, """
        store:
          flsuh: async
        security:
          tls:
            mdoe: "on"
        topics:
          - name: a
            partitons: 2
    """))
    assert "store.flsuh: unknown setting; did you mean `flush`?" in message
    assert "security.tls.mdoe: unknown setting; did you mean `mode`?" in message
    assert "topics.0.partitons: unknown setting; did you mean `partitions`?" in message


def test_a_misspelt_section_names_the_nearest_valid_one(tmp_path):
    message = refusal(write(tmp_path, """
        brokr:
          port: 9001
        replicaton:
          port: 9002
    """))
    assert "brokr: unknown section; did you mean `broker`?" in message
    assert "replicaton: unknown section; did you mean `replication`?" in message


def test_a_setting_in_the_wrong_place_names_the_sections_that_have_it(tmp_path):
    message = refusal(write(tmp_path, """
        data_dir: /srv/metaq
        store:
          log_level: DEBUG
    """))
    assert "data_dir: unknown section; `data_dir` is a setting of `broker:`" in message
    assert "store.log_level: unknown setting; `log_level` is a setting of `broker:`" in message


def test_an_unknown_key_like_no_setting_is_named_alone(tmp_path):
    message = refusal(write(tmp_path, """
        store:
          zzzzzz: 1
        qqqqqq: 2
    """))
    assert message.endswith("store.zzzzzz: unknown setting; qqqqqq: unknown section"), message
