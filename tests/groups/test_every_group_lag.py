"""Every consumer group in the lag report (docs/operating.md "Consumer groups and their lag"): a text group's
committed offset, a RocketMQ 5 POP group received over gRPC, an MQTT shared group and an offline persistent session,
each with a known backlog, listed by ``metaq-admin groups`` (here) and by ``metaq-spark-report``
(``tests/spark/test_every_group_lag.py``) with the right lag."""

import json
import subprocess
import sys

import pytest

from metaq.groups import limits as groups_limits
from metaq.client.local import free_port, small_config
from metaq.protocol import events as ev
from metaq.protocol import stats as stats_codec
from metaq.protocol.text import serialize
from tests.harness.broker import url_of, wait_for
from metaq.mqtt import wire
from tests.harness.mqtt import Paho, Raw, with_mqtt

grpc = pytest.importorskip("grpc")
pytest.importorskip("metaq.rmq5.messages_pb2")

from tests.rmq5.test_grpc_port import Client  # noqa: E402
from tests.rmq5.test_pop_grpc import ack, receive  # noqa: E402

N = 10
#: (group, kind) -> (lag, in flight) each group is left with (``groups``): what the report must say.
EXPECTED = {("txtg", "offsets"): (6, None), ("popg", "pop"): (9, 3),
            ("$share/sg/lagm/#", "mqtt_shared"): (N, None), ("dev 1", "mqtt_session"): (N, 0),
            ("dev2", "mqtt_session"): (0, N)}


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    """One broker (every topic one partition) with four groups of four kinds in known states: ``txtg`` committed
    offset 4 of 10; ``popg`` received 4 of 10 over gRPC and acknowledged the third (out of order: 9 not acknowledged,
    3 in flight); an MQTT persistent session ``dev 1`` holding ``lagm/#`` and ``$share/sg/lagm/#``, gone offline
    before 10 messages were published (both 10 behind); a connected persistent session ``dev2`` sent the 10 and
    acknowledging none (none behind, 10 in flight)."""
    from metaq.client.local import BrokerProcess

    wd = tmp_path_factory.mktemp("everygroup")
    cfg = with_mqtt(small_config(wd / "data", grpc={"port": free_port()}, topics=[{"name": "*", "partitions": 1}]))
    b = BrokerProcess(wd, cfg).start()
    try:
        with b.client() as c:
            for i in range(N):
                c.put_ok("lagt", b"t%d" % i, 0)
                c.put_ok("lagp", b"p%d" % i, 0)
            assert c.call(ev.CommitOffset("txtg", "lagt", 0, 4, c.opaque())).code == 200
        g = Client(cfg["grpc"]["port"])
        try:
            _status, got = receive(g, "popg", "lagp", batch=4, invisible_ms=600_000)
            assert len(got) == 4
            ack(g, "popg", "lagp", got[2])
        finally:
            g.close()
        dev = Paho(b, "dev 1", clean=False, properties=_expiry())
        dev.subscribe("lagm/#", qos=1)
        dev.subscribe("$share/sg/lagm/#", qos=1)
        dev.close()
        wait_for(lambda: _stat(b, "mqtt_sessions_offline") == "1", what="dev1 offline")
        dev2 = Raw(b)
        assert dev2.connect("dev2", clean_start=False, properties={"session_expiry_interval": 3600}).reason_code == 0
        dev2.send(wire.Subscribe(1, (wire.Subscription("lagm/#", 1),)))
        assert dev2.read() == wire.Suback(1, (1,))
        pub = Paho(b, "pub")
        for i in range(N):
            pub.publish("lagm/x", b"m%d" % i, qos=1)
        pub.close()
        assert [dev2.read().payload for _i in range(N)] == [b"m%d" % i for i in range(N)]  # none acknowledged
        yield b
        dev2.close()
    finally:
        b.kill()


def _expiry():
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    return props


def _stat(b, key):
    with b.client() as c:
        return c.stats_dict().get(key)


def _lags(rows, lag="lag", in_flight="in_flight", number=lambda v: v):
    """``{(group, kind): (lag, in flight)}`` of the expected groups, the lags of a group's partitions summed."""
    out = {}
    for r in rows:
        key = (r["group"], r["kind"])
        if key in EXPECTED:
            total, flying = out.get(key, (0, None))
            f = number(r[in_flight])
            out[key] = (total + number(r[lag]), f if flying is None else flying + (f or 0))
    return out


def test_metaq_admin_groups_lists_every_kind_of_group_with_its_lag(groups):
    out = subprocess.run([sys.executable, "-m", "metaq.admincli", "--brokers", url_of(groups), "--json", "groups"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert _lags(rows) == EXPECTED, rows
    [pop] = [r for r in rows if r["group"] == "popg"]
    assert (pop["committed"], pop["max_offset"]) == (0, N)  # its lowest offset not acknowledged, the end


def _commit(c, groups, topic, offset):
    """Commit ``offset`` of ``topic``'s partition 0 for each of ``groups``, pipelined."""
    for i in range(0, len(groups), 1000):
        chunk = groups[i:i + 1000]
        c.send(b"".join(serialize(ev.CommitOffset(g, topic, 0, offset, c.opaque())) for g in chunk))
        assert all(c.read_event().code == 200 for _g in chunk)


@pytest.mark.slow
def test_a_broker_answers_at_most_its_limit_of_group_rows_the_most_behind_and_says_how_many_it_left_out(
        broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "data", topics=[{"name": "*", "partitions": 1}]))
    most = groups_limits.MAX_GROUP_LAG_ROWS
    with b.client() as c:
        for i in range(3):
            c.put_ok("lim", b"m%d" % i, 0)
        _commit(c, ["g%05d" % i for i in range(most)], "lim", 1)  # each 2 behind
        rows, left_out = stats_codec.parse_groups_page(c.stats("groups").encode())
        assert (len(rows), left_out) == (most, 0)  # the limit: every row
        _commit(c, ["behind"], "lim", 0)  # one past it, 3 behind
        rows, left_out = stats_codec.parse_groups_page(c.stats("groups").encode())
    assert (len(rows), left_out) == (most, 1)
    assert ("behind", 3) in [(r.group, r.lag) for r in rows]  # the most behind kept
    out = subprocess.run([sys.executable, "-m", "metaq.admincli", "--brokers", url_of(b), "--json", "groups"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and len(json.loads(out.stdout)) == most, out.stderr
    assert "left out 1 group rows past its limit (limits.MAX_GROUP_LAG_ROWS)" in out.stderr
