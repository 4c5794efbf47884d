"""State a client can make the broker keep: put acks it never reads, open transactions, committed offsets.

Each is bounded: ``MAX_PENDING_BURSTS`` (then the connection is not read), ``transactions.max_open`` and
``transactions.max_held_bytes``, ``MAX_CONSUMER_OFFSETS``.
"""


from metaq.offsets import limits as offsets_limits
from metaq.client.local import small_config
from metaq.protocol import events as ev
from metaq.protocol.text import serialize
from tests.harness.broker import wait_for
from tests.hostile.common import unread_flood

MiB = 1 << 20


def test_a_producer_that_never_reads_its_acks_does_not_grow_the_broker(broker_factory, tmp_path):
    broker = broker_factory(small_config(tmp_path / "data", store={"segment_size": 64 * MiB}))
    body = b"p" * 1024
    puts = b"".join(serialize(ev.Put("acks", 0, 0, body, i)) for i in range(100_000))  # ~105 MB of puts
    with unread_flood(broker, broker.port, puts) as (grown, probe):
        assert grown < 100 * MiB, "the broker grew %.0f MB for one producer's unread acks" % (grown / MiB)
        assert not probe.failures and probe.p99() < 0.050
        with broker.client(timeout=30) as c:
            stored = int(c.stats_dict()["cmd_put"])
        assert stored < 100_000, "every put was taken with no one reading the acks"
    with broker.client(timeout=30) as c:  # what was acknowledged-or-not, the broker is normal after
        assert c.call(ev.Version(1)).code == 200
        c.put_ok("acks", b"after", partition=1)


def test_open_transactions_past_the_broker_limit_are_refused(broker_factory, tmp_path):
    broker = broker_factory(small_config(tmp_path / "data", transactions={"max_open": 4}))
    with broker.client() as c:
        for n in range(1, 5):  # at the limit, each on its own session
            r = c.call(ev.Transaction("TX:1:%d" % n, "s%d" % n, "BEGIN", n))
            assert r.code == 200, r
        r = c.call(ev.Transaction("TX:1:5", "s5", "BEGIN", 5))  # one past
        assert r.code == 500
        assert r.body == (b"XAException:code=-3,msg=too many open transactions on the broker: "
                          b"the limit is 4 (transactions.max_open)")
        assert c.call(ev.Transaction("TX:1:1", "s1", "ROLLBACK", 6)).code == 200  # a place is freed
        assert c.call(ev.Transaction("TX:1:6", "s6", "BEGIN", 7)).code == 200


def test_committed_offsets_past_the_broker_limit_are_refused(broker_factory, tmp_path):
    broker = broker_factory(small_config(tmp_path / "data"))
    n = offsets_limits.MAX_CONSUMER_OFFSETS
    with broker.client(timeout=60) as c:
        c.put_ok("oc", b"one message", partition=0)
        c.send(b"".join(serialize(ev.CommitOffset("g%d" % i, "oc", 0, 1, i)) for i in range(n)))  # the limit
        replies = [c.read_event() for _ in range(n)]
        assert all(r.code == 200 for r in replies), [r for r in replies if r.code != 200][:3]
        r = c.call(ev.CommitOffset("one-more", "oc", 0, 1, n))  # one past
        assert r.code == 400
        assert r.body.startswith(b"too many committed offsets on the broker: the limit is %d" % n)
        assert c.call(ev.CommitOffset("g7", "oc", 0, 0, n + 1)).code == 200  # an existing one still moves
        assert c.call(ev.QueryOffset("g7", "oc", 0, n + 2)).body == b"0"
    wait_for(lambda: broker.proc.poll() is None, what="the broker to stay up")


def test_heartbeats_past_the_registry_limit_are_refused(broker_factory, tmp_path):
    from metaq.client.local import rmq_config
    from metaq.client.raw import RemotingClient
    from metaq.protocol.rocketmq.remoting import RequestCode, ResponseCode

    n = 60
    broker = broker_factory(rmq_config(tmp_path / "data", {"max_client_entries": n}))
    groups = ",".join('{"groupName":"G%d","consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING",'
                      '"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","subscriptionDataSet":[],"unitMode":false}' % g
                      for g in range(20))

    def beat(rc, client):
        body = '{"clientID":"%s","consumerDataSet":[%s],"producerDataSet":[]}' % (client, groups)
        return rc.call(RequestCode.HEART_BEAT, {}, body.encode())

    with RemotingClient(broker.config["remoting"]["port"]) as rc:
        for k in range(n // 20):  # 3 clients in 20 groups each: the limit
            assert beat(rc, "c%d" % k).code == ResponseCode.SUCCESS
        r = beat(rc, "one-more")  # past it
        assert r.code == ResponseCode.INVALID_PARAMETER
        assert r.remark == "too many RocketMQ clients registered: the limit is %d (group, client) entries" % n
        assert beat(rc, "c1").code == ResponseCode.SUCCESS  # a known client still beats
