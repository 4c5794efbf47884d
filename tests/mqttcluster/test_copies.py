"""A record crossing brokers is decoded and encoded as few times as the walk needs (docs/mqtt.md "A cluster"):
published on A, read by A's follow of B's route by its name alone, kept as it is in B's inbox, decoded once by
B's delivery. The brokers count their codec's calls on the test's payload (``tests.harness.codeccount``)."""

from tests.harness.broker import wait_for
from tests.harness.codeccount import counting, read_counts
from tests.harness.mqtt import Paho
from tests.harness.mqttcluster import Cluster, wait_routed

MARK = "payload-walk-7f3a"
N = 20


def test_a_record_crossing_brokers_is_decoded_once(broker_factory, tmp_path, zk_connect, monkeypatch):
    monkeypatch.setenv("METAQ_PURE_PYTHON", "1")  # every codec call a Python one, the wrapper's
    cluster = Cluster(broker_factory, tmp_path, zk_connect, 2)
    outs = [tmp_path / ("counts-%d.json" % i) for i in range(2)]
    for i, cfg in enumerate(cluster.configs):
        b = broker_factory(cfg, workdir=tmp_path / ("b%d" % i), start=False)
        b.prefix = counting(outs[i], MARK)
        cluster.brokers.append(b.start())
    cluster.wait_linked()
    sub = Paho(cluster[1], "walk-sub")
    assert sub.subscribe("walk/#", 1) == [1]
    pub = Paho(cluster[0], "walk-pub")
    wait_routed(sub, lambda i: pub.publish("walk/probe", b"probe", 1))
    before = [read_counts(o) for o in outs]
    for i in range(N):
        pub.publish("walk/t", b"%s-%d" % (MARK.encode(), i), 1)
    got = sub.wait_messages(N, 20)
    assert sorted(m.payload for m in got) == sorted(b"%s-%d" % (MARK.encode(), i) for i in range(N))
    wait_for(lambda: read_counts(outs[1])["decode_payload"] - before[1]["decode_payload"] >= N, 5, "B's counts")
    after = [read_counts(o) for o in outs]
    calls = [{k: after[b][k] - before[b][k] for k in after[b]} for b in range(2)]
    # A: at most its publish's encode (its follow reads the name alone); B: delivery's one decode (the copy is kept
    # as it came, neither decoded nor encoded)
    assert calls[0]["decode_payload"] == 0 and calls[0]["encode_payload"] <= N, calls
    assert calls[1] == {"encode_payload": 0, "decode_payload": N}, calls
