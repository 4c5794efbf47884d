"""The gRPC port against the official RocketMQ 5 Python client (``rocketmq-python-client``), a client nobody here
wrote: its Producer (normal, FIFO, timed and transactional messages, the TransactionChecker answering a check-back)
and its SimpleConsumer (receive, ack, change_invisible_duration, redelivery, filters), against real broker
processes, across a kill -9 and over two brokers of a ZooKeeper cluster.

The client installs the import package ``rocketmq``, which the test extra's RocketMQ 4 client owns too, so it lives
in a virtualenv of its own (``.venv-rmq5``, made by ``make test``); these tests run tests/rmq5/official/driver.py
under that virtualenv's Python and command it over its stdin and stdout, one JSON line each way."""

import json
import os
import queue
import subprocess
import threading
import time

import pytest

from metaq.client.local import BrokerProcess, free_port, small_config
from metaq.client.raw import TextClient
from metaq.groups.wire import GroupSettingsCommand
from metaq.protocol.properties import split_attribute
from tests.harness.broker import wait_for
from tests.rmq5.test_grpc_port import stored

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = os.path.join(ROOT, "tests", "rmq5", "official", "driver.py")
CHECK_MS = 300  # the broker's check-back: a round every 300 ms, a half message due 600 ms after it was stored
TIMEOUT_MS = 600


def client_python():
    """The official client's Python: ``METAQ_RMQ5_PYTHON`` (the Makefile sets it), else ``.venv-rmq5``'s. Missing:
    a failure under make (``make test`` builds it), a skip when the tests run by hand without it."""
    path = os.environ.get("METAQ_RMQ5_PYTHON") or os.path.join(ROOT, ".venv-rmq5", "bin", "python")
    if not os.access(path, os.X_OK):
        if os.environ.get("MAKELEVEL"):
            pytest.fail("%s is missing: `make test` builds the official RocketMQ 5 client's virtualenv" % path)
        pytest.skip("the official RocketMQ 5 client's virtualenv (%s) is missing: `make test` or "
                    "`make .venv-rmq5/.installed` builds it" % path)
    return path


class Official:
    """One driver process of the official client, pointed at ``endpoints``; ``call`` sends a command and returns
    its answer, failing the test on an error answer (``expect_error=True``: returns the error text)."""

    def __init__(self, python, endpoints, home):
        os.makedirs(str(home), exist_ok=True)
        self.home = str(home)  # the client writes its log under $HOME/logs/rocketmq_python
        env = dict(os.environ, HOME=self.home, PYTHONPATH="")
        self.proc = subprocess.Popen([python, DRIVER, endpoints], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(os.path.join(self.home, "driver.err"), "ab"), text=True, env=env)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def log(self):
        path = os.path.join(self.home, "logs", "rocketmq_python", "rocketmq_client.log")
        text = open(path).read() if os.path.exists(path) else ""
        return text[-3000:] + open(os.path.join(self.home, "driver.err")).read()[-3000:]

    def call(self, op, timeout=30, expect_error=False, **kw):
        self.proc.stdin.write(json.dumps(dict(kw, op=op)) + "\n")
        self.proc.stdin.flush()
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no answer to %s in %d s:\n%s" % (op, timeout, self.log())) from None
        assert line is not None, "the driver exited:\n%s" % self.log()
        answer = json.loads(line)
        if expect_error is None:
            return answer
        if expect_error:
            assert "error" in answer, answer
            return answer["error"]
        assert "error" not in answer, "%s: %s\n%s" % (op, answer["error"], self.log())
        return answer

    def until_ok(self, op, within=30.0, **kw):
        """``call`` again while it answers an error (a channel reconnecting after its broker came back, as an
        application retries), for up to ``within`` seconds; the first answer that is no error and the errors."""
        errors = []
        deadline = time.monotonic() + within
        while True:
            answer = self.call(op, timeout=within, expect_error=None, **kw)
            if "error" not in answer or time.monotonic() > deadline:
                assert "error" not in answer, "%s: %s\n%s" % (op, errors[-3:] + [answer["error"]], self.log())
                return answer, errors
            errors.append(answer["error"])
            time.sleep(0.5)

    def receive_all(self, consumer, want, invisible_s=10, timeout=15.0, ack=True, reconnecting=False):
        """Receive until ``want`` messages came (acknowledging each with ``ack``) or ``timeout``; the messages.
        ``reconnecting``: a receive answered UNAVAILABLE is tried again (each client's channel reconnects on its
        own backoff after its broker came back, as an application retries); any other error fails."""
        got = []
        deadline = time.monotonic() + timeout
        while len(got) < want and time.monotonic() < deadline:
            answer = self.call("receive", expect_error=None if reconnecting else False, consumer=consumer, max=16,
                               invisible_s=invisible_s)
            if "error" in answer:
                assert "UNAVAILABLE" in answer["error"], "receive: %s\n%s" % (answer["error"], self.log())
                time.sleep(0.5)
                continue
            batch = answer["messages"]
            if ack and batch:
                self.call("ack", consumer=consumer, ids=[m["message_id"] for m in batch])
            got += batch
        return got

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(15)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)


FIFO_GROUP = "g-o-fifo"  # a group whose fifo setting is on: the Python client never asks for FIFO itself


def grpc_config(data_dir, port, **sections):
    return small_config(data_dir, grpc={"port": port},
                        store={"flush": "async", "flush_interval_ms": 20},
                        remoting={"transaction_check_interval_ms": CHECK_MS, "transaction_timeout_ms": TIMEOUT_MS,
                                  "transaction_check_max": 50}, **sections)


def endpoint(b):
    return "127.0.0.1:%d" % b.config["grpc"]["port"]


@pytest.fixture(scope="module")
def python():
    return client_python()


@pytest.fixture(scope="module")
def broker(tmp_path_factory, python):
    wd = tmp_path_factory.mktemp("official5")
    b = BrokerProcess(wd, grpc_config(wd / "data", free_port())).start()
    with b.client() as c:  # the group table's fifo, as metaq-admin group-settings set g-o-fifo --fifo true sets it
        assert c.call(GroupSettingsCommand("set", FIFO_GROUP, (("fifo", "1"),), c.opaque())).code == 200
    yield b
    b.kill()


@pytest.fixture(scope="module")
def official(broker, python, tmp_path_factory):
    """One official client process for the module's tests: each test makes its own producers and consumers."""
    o = Official(python, endpoint(broker), tmp_path_factory.mktemp("official5-home"))
    yield o
    o.close()


def text_records(b, topic):
    """``{payload: (partition, tags, properties)}`` of what a text ``get`` reads of ``topic``."""
    out = {}
    for p, recs in stored(b, topic).items():
        for rec in recs:
            tags, props, _from_rocketmq = split_attribute(rec.attribute)
            out[rec.payload] = (p, tags, props)
    return out


def ordered(b, topic):
    """The payloads of ``topic`` as a text ``get`` reads them, partition by partition."""
    return {p: [rec.payload for rec in recs] for p, recs in stored(b, topic).items() if recs}


# -- the producer ------------------------------------------------------------------------------------------------


def test_a_normal_send_is_read_by_a_text_get_with_its_tag_keys_and_properties(broker, official):
    official.call("producer", name="p-normal", topics=["tq-o-normal"])
    r = official.call("send", producer="p-normal", messages=[
        {"topic": "tq-o-normal", "body": "n%d" % i, "tag": "TagA", "keys": ["k%d" % i, "order-%d" % i],
         "props": {"color": "red"}} for i in range(3)])
    ids = [e["message_id"] for e in r["receipts"]]
    assert len(set(ids)) == 3 and all(ids)
    got = text_records(broker, "tq-o-normal")
    assert sorted(got) == [b"n0", b"n1", b"n2"]
    for i, body in enumerate([b"n0", b"n1", b"n2"]):
        _p, tags, props = got[body]
        assert tags == "TagA"
        assert props["color"] == "red" and sorted(props["KEYS"].split(" ")) == ["k%d" % i, "order-%d" % i]
        assert props["UNIQ_KEY"] == ids[i]  # the client's message id


def test_a_message_group_goes_to_one_queue_in_the_order_sent(broker, official):
    official.call("producer", name="p-fifo", topics=["tq-o-fifo"])
    official.call("send", producer="p-fifo", messages=[{"topic": "tq-o-fifo", "body": "a%d" % i, "group": "ga"}
                                                        for i in range(5)])
    official.call("send", producer="p-fifo", messages=[{"topic": "tq-o-fifo", "body": "b%d" % i, "group": "gb"}
                                                        for i in range(5)])
    by_partition = ordered(broker, "tq-o-fifo")
    for g in (b"a", b"b"):
        [(_p, bodies)] = [(p, [x for x in v if x.startswith(g)]) for p, v in by_partition.items()
                          if any(x.startswith(g) for x in v)]
        assert bodies == [g + b"%d" % i for i in range(5)]
        assert all(text_records(broker, "tq-o-fifo")[b][2]["__SHARDINGKEY"] == "g" + g.decode() for b in bodies)


def test_a_timed_message_appears_at_its_delivery_time(broker, official):
    official.call("producer", name="p-timed", topics=["tq-o-timed"])
    sent = time.time()
    r = official.call("send", producer="p-timed", messages=[{"topic": "tq-o-timed", "body": "later", "delay_s": 2}])
    assert r["receipts"][0]["recall_handle"]  # a timed message's send answers a recall handle
    assert text_records(broker, "tq-o-timed") == {}
    wait_for(lambda: b"later" in text_records(broker, "tq-o-timed"), 10, "the timed message in its topic")
    assert time.time() - sent >= 1.0  # the client's delivery time is in whole seconds
    official.call("consumer", name="c-timed", group="g-o-timed", subscriptions={"tq-o-timed": ["TAG", "*"]})
    [m] = official.receive_all("c-timed", 1)
    assert m["body"] == "later" and m["delivery_timestamp"] >= int(sent) * 1000


def test_transactions_committed_and_rolled_back_by_the_client(broker, official):
    official.call("producer", name="p-tx", topics=["tq-o-tx"], checker={})
    r = official.call("send", producer="p-tx", messages=[{"topic": "tq-o-tx", "body": "committed", "tag": "T"}],
                      transaction="commit")
    assert r["receipts"][0]["transaction_id"]
    official.call("send", producer="p-tx", messages=[{"topic": "tq-o-tx", "body": "rolled-back"}],
                  transaction="rollback")
    assert sorted(text_records(broker, "tq-o-tx")) == [b"committed"]
    time.sleep(TIMEOUT_MS * 3 / 1000.0)  # past a check-back: nothing left to ask about, nothing more appears
    assert sorted(text_records(broker, "tq-o-tx")) == [b"committed"]
    assert [c for c in official.call("checks")["checks"] if c[0] in ("committed", "rolled-back")] == []


def test_open_transactions_are_checked_back_through_the_clients_transaction_checker(broker, official):
    official.call("producer", name="p-check", topics=["tq-o-check"],
                  checker={"check-commit": "COMMIT", "check-rollback": "ROLLBACK"})
    r = official.call("send", producer="p-check", transaction="open", messages=[
        {"topic": "tq-o-check", "body": "check-commit", "props": {"order": "1"}},
        {"topic": "tq-o-check", "body": "check-rollback"}])
    ids = {e["message_id"] for e in r["receipts"]}
    assert text_records(broker, "tq-o-check") == {}  # half messages: invisible until decided
    wait_for(lambda: {c[0] for c in official.call("checks")["checks"]} >= {"check-commit", "check-rollback"}, 15,
             "both half messages checked back")
    assert {c[1] for c in official.call("checks")["checks"] if c[0].startswith("check-")} == ids
    wait_for(lambda: b"check-commit" in text_records(broker, "tq-o-check"), 10, "the committed one stored")
    time.sleep(TIMEOUT_MS * 3 / 1000.0)
    got = text_records(broker, "tq-o-check")
    assert sorted(got) == [b"check-commit"] and got[b"check-commit"][2]["order"] == "1"


# -- the simple consumer -----------------------------------------------------------------------------------------


def test_receive_ack_change_invisible_duration_and_redelivery(broker, official):
    official.call("producer", name="p-pop", topics=["tq-o-pop"])
    official.call("send", producer="p-pop", messages=[{"topic": "tq-o-pop", "body": "m%d" % i, "tag": "T",
                                                       "keys": ["key-%d" % i], "props": {"i": str(i)}}
                                                      for i in range(3)])
    official.call("consumer", name="c-pop", group="g-o-pop", subscriptions={"tq-o-pop": ["TAG", "*"]})
    first = official.receive_all("c-pop", 3, invisible_s=5, ack=False)
    by_body = {m["body"]: m for m in first}
    assert sorted(by_body) == ["m0", "m1", "m2"]
    m0 = by_body["m0"]
    assert m0["tag"] == "T" and m0["keys"] == ["key-0"] and m0["props"] == {"i": "0"} and m0["attempt"] == 1
    assert not any(m["corrupted"] for m in first)  # the body digest the broker sends checks out
    official.call("ack", consumer="c-pop", ids=[m0["message_id"]])
    official.call("change", consumer="c-pop", ids=[by_body["m1"]["message_id"]], invisible_s=1)
    # m1 comes back after its new 1 s, m2 after its first 5 s (far apart: one receive never gets both), m0
    # (acknowledged) never
    again = official.receive_all("c-pop", 1, invisible_s=30, ack=False, timeout=2.5)
    assert [(m["body"], m["attempt"]) for m in again] == [("m1", 2)]
    later = official.receive_all("c-pop", 1, invisible_s=30, ack=False, timeout=10)
    assert [(m["body"], m["attempt"]) for m in later] == [("m2", 2)]
    official.call("ack", consumer="c-pop", ids=[m["message_id"] for m in again + later])
    assert official.call("receive", consumer="c-pop", max=16, invisible_s=1)["messages"] == []
    # the client keeps the handle a change answered: acknowledging with it again is still OK (a repeated ack)
    official.call("ack", consumer="c-pop", ids=[by_body["m1"]["message_id"]])


def test_a_text_put_is_received_and_a_send_read_by_a_text_get(broker, official):
    with TextClient(broker.host, broker.port, 10) as text:
        assert text.put("tq-o-cross", b"from-text", partition=1).code == 200
    official.call("consumer", name="c-cross", group="g-o-cross", subscriptions={"tq-o-cross": ["TAG", "*"]})
    [m] = official.receive_all("c-cross", 1)
    assert m["body"] == "from-text" and m["message_id"] and m["attempt"] == 1
    official.call("producer", name="p-cross", topics=["tq-o-cross"])
    official.call("send", producer="p-cross", messages=[{"topic": "tq-o-cross", "body": "from-grpc"}])
    assert sorted(text_records(broker, "tq-o-cross")) == [b"from-grpc", b"from-text"]
    [m] = official.receive_all("c-cross", 1)
    assert m["body"] == "from-grpc"


def test_tag_and_sql92_filters_deliver_only_what_matches(broker, official):
    official.call("producer", name="p-filter", topics=["tq-o-filter"])
    official.call("send", producer="p-filter", messages=[
        {"topic": "tq-o-filter", "body": "a", "tag": "TagA", "props": {"n": "1"}},
        {"topic": "tq-o-filter", "body": "b", "tag": "TagB", "props": {"n": "5"}},
        {"topic": "tq-o-filter", "body": "c", "tag": "TagC", "props": {"n": "9"}},
        {"topic": "tq-o-filter", "body": "none", "props": {"n": "7"}}])
    official.call("consumer", name="c-tag", group="g-o-tag", subscriptions={"tq-o-filter": ["TAG", "TagA || TagC"]})
    official.call("consumer", name="c-sql", group="g-o-sql",
                  subscriptions={"tq-o-filter": ["SQL92", "n > 4 AND (TAGS IS NULL OR TAGS <> 'TagC')"]})
    official.call("consumer", name="c-all", group="g-o-all", subscriptions={"tq-o-filter": ["TAG", "*"]})
    assert sorted(m["body"] for m in official.receive_all("c-tag", 2)) == ["a", "c"]
    assert sorted(m["body"] for m in official.receive_all("c-sql", 2)) == ["b", "none"]
    assert sorted(m["body"] for m in official.receive_all("c-all", 4)) == ["a", "b", "c", "none"]
    for c in ("c-tag", "c-sql"):  # what the expression refused is never delivered to the group
        assert official.call("receive", consumer=c, max=16, invisible_s=1)["messages"] == []


def test_one_consumer_receives_a_message_group_in_the_order_sent(broker, official):
    """The messages of a group share a queue and come out in order. (A FIFO consumer group, one message of a
    group at a time, is a group setting on RocketMQ's side and here: the next test.)"""
    official.call("producer", name="p-order", topics=["tq-o-order"])
    for g in ("x", "y"):
        official.call("send", producer="p-order", messages=[{"topic": "tq-o-order", "body": "%s%d" % (g, i),
                                                             "group": g} for i in range(6)])
    official.call("consumer", name="c-order", group="g-o-order", subscriptions={"tq-o-order": ["TAG", "*"]})
    got = official.receive_all("c-order", 12)
    for g in ("x", "y"):
        seq = [m["body"] for m in got if m["group"] == g]
        assert seq == ["%s%d" % (g, i) for i in range(6)]


def test_a_group_whose_fifo_setting_is_on_gets_one_message_of_a_message_group_at_a_time_in_order(broker, official):
    official.call("producer", name="p-fifo-group", topics=["tq-o-fifogroup"])
    for g in ("x", "y"):
        official.call("send", producer="p-fifo-group", messages=[
            {"topic": "tq-o-fifogroup", "body": "%s%d" % (g, i), "group": g} for i in range(3)])
    official.call("consumer", name="c-fifo", group=FIFO_GROUP, subscriptions={"tq-o-fifogroup": ["TAG", "*"]})
    for i in range(3):
        batch = official.receive_all("c-fifo", 2, invisible_s=30, ack=False, timeout=5)
        assert sorted(m["body"] for m in batch) == ["x%d" % i, "y%d" % i]
        if i == 0:  # the next of a message group waits while the one before is unacknowledged
            assert official.call("receive", consumer="c-fifo", max=16, invisible_s=30)["messages"] == []
        official.call("ack", consumer="c-fifo", ids=[m["message_id"] for m in batch])


def test_a_push_consumer_consumes_each_message_and_gets_a_failed_one_again(broker, official):
    official.call("producer", name="p-push", topics=["tq-o-push"])
    official.call("send", producer="p-push", messages=[{"topic": "tq-o-push", "body": "u%d" % i} for i in range(4)])
    official.call("push", name="c-push", group="g-o-push", subscriptions={"tq-o-push": ["TAG", "*"]}, fail=["u2"])
    want = [["u0", 1], ["u1", 1], ["u2", 1], ["u2", 2], ["u3", 1]]
    wait_for(lambda: sorted(official.call("pushed", name="c-push")["calls"]) == want, 15,
             lambda: "each consumed once, u2 again after its failure: %s" % official.call("pushed", name="c-push"))
    official.call("shutdown", name="c-push")
    official.call("consumer", name="c-push-after", group="g-o-push", subscriptions={"tq-o-push": ["TAG", "*"]})
    assert official.call("receive", consumer="c-push-after", max=16, invisible_s=1)["messages"] == []  # all acked


def test_a_consumer_shut_down_while_it_long_polls_ends_its_connection_cleanly(broker, official):
    official.call("consumer", name="c-bye", group="g-o-bye", subscriptions={"tq-o-bye": ["TAG", "*"]}, await_s=5)
    before = len(broker.log_text())
    answer = official.call("shutdown_receiving", name="c-bye", after_s=1.5, timeout=40)
    assert "receive" in answer, answer  # it ended (the client cancels it), the driver goes on
    logged = broker.log_text()[before:]
    assert "HTTP/2 protocol error" not in logged, logged[-2000:]
    official.call("consumer", name="c-bye-after", group="g-o-bye", subscriptions={"tq-o-bye": ["TAG", "*"]})
    assert official.call("receive", consumer="c-bye-after", max=16, invisible_s=1)["messages"] == []  # still alive


# -- across a kill -9 and over two brokers -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.fault
def test_receive_and_ack_go_on_across_a_kill_9_and_a_restart_on_the_same_port(python, broker_factory, tmp_path):
    """One client process throughout: what it acknowledged before the kill never comes back; what it had received
    and not acknowledged comes back once its invisible time is over; its producer sends again."""
    port = free_port()
    b = broker_factory(grpc_config(tmp_path / "b" / "data", port), workdir=tmp_path / "b")
    o = Official(python, "127.0.0.1:%d" % port, tmp_path / "home")
    try:
        o.call("producer", name="p", topics=["tq-o-kill"])
        o.call("send", producer="p", messages=[{"topic": "tq-o-kill", "body": "k%d" % i} for i in range(6)])
        o.call("consumer", name="c", group="g-o-kill", subscriptions={"tq-o-kill": ["TAG", "*"]})
        got = o.receive_all("c", 6, invisible_s=4, ack=False)
        assert sorted(m["body"] for m in got) == ["k%d" % i for i in range(6)]
        acked = sorted(got, key=lambda m: m["body"])[:3]
        o.call("ack", consumer="c", ids=[m["message_id"] for m in acked])
        time.sleep(0.2)  # the acknowledgements reach the journal's async flush
        b.kill()
        b.start()
        _answer, errors = o.until_ok("send", producer="p", messages=[{"topic": "tq-o-kill", "body": "after"}])
        assert all("UNAVAILABLE" in e for e in errors), errors  # the channel reconnecting, nothing else
        again = o.receive_all("c", 4, invisible_s=30, timeout=25, reconnecting=True)
        assert sorted(m["body"] for m in again) == ["after", "k3", "k4", "k5"]
        assert {m["body"]: m["attempt"] for m in again if m["body"] != "after"} == {"k3": 2, "k4": 2, "k5": 2}
        assert o.call("receive", consumer="c", max=16, invisible_s=1)["messages"] == []
    finally:
        o.close()


@pytest.mark.slow
@pytest.mark.fault
def test_two_brokers_share_sends_and_receives_and_a_killed_one_is_passed_over(python, broker_factory, tmp_path,
                                                                               zk_connect):
    """Given broker 1 alone as its endpoint, the client's route names both brokers of the ZooKeeper cluster: its
    sends land on both, its consumer receives from both; once broker 2 is killed, its sends go on (retried on
    broker 1's queues)."""
    from tests.harness.ha import SESSION_MS

    brokers = []
    for i in (1, 2):
        wd = tmp_path / ("b%d" % i)
        brokers.append(broker_factory(grpc_config(wd / "data", free_port(), broker={"id": i},
                                                  zk={"connect": zk_connect, "session_timeout_ms": SESSION_MS}),
                                      workdir=wd))
    for b in brokers:
        with TextClient(b.host, b.port, 10) as text:  # both hold the topic
            assert text.put("tq-o-two", b"init").code == 200
    one, two = brokers
    from tests.rmq5.test_grpc_port import Client

    def named():
        c = Client(one.config["grpc"]["port"])
        try:
            return {q.broker.name for q in c.route("tq-o-two").message_queues}
        finally:
            c.close()
    wait_for(lambda: len(named()) == 2, 15, lambda: "both brokers in broker 1's route: %s" % named())
    o = Official(python, endpoint(one), tmp_path / "home")
    try:
        o.call("producer", name="p", topics=["tq-o-two"])
        o.call("send", producer="p", messages=[{"topic": "tq-o-two", "body": "s%d" % i} for i in range(16)])
        counts = [sum(1 for body in text_records(b, "tq-o-two") if body.startswith(b"s")) for b in brokers]
        assert sum(counts) == 16 and counts[0] > 0 and counts[1] > 0, counts
        o.call("consumer", name="c", group="g-o-two", subscriptions={"tq-o-two": ["TAG", "*"]})
        got = o.receive_all("c", 18, timeout=25)
        assert sorted(m["body"] for m in got) == sorted(["init", "init"] + ["s%d" % i for i in range(16)])
        two.kill()
        for i in range(8):
            o.until_ok("send", producer="p", messages=[{"topic": "tq-o-two", "body": "f%d" % i}])
        assert sorted(b for b in text_records(one, "tq-o-two") if b.startswith(b"f")) == [b"f%d" % i
                                                                                           for i in range(8)]
    finally:
        o.close()


@pytest.mark.slow
@pytest.mark.fault
def test_the_client_follows_an_elected_master_after_a_kill_9_and_loses_no_acknowledged_send(python, broker_factory,
                                                                                            tmp_path, zk_connect):
    """An ``ha: auto`` group of three with ``sync`` replication, every member's gRPC endpoint given to the client:
    once the master is killed and another elected, the client's sends go on to it (failing meanwhile), and a
    consumer receives every send that was acknowledged, before and after, once each."""
    from tests.harness.ha import SESSION_MS, Group

    g = Group(broker_factory, tmp_path, zk_connect, n=3, mode="sync", start=False)
    for m in g.members:
        m.config["grpc"] = {"port": free_port()}
        m.start()
    first = g.master()
    others = [i for i in range(3) if i != first]
    g.following(first, others)
    o = Official(python, ";".join(endpoint(g.members[i]) for i in [first] + others), tmp_path / "home")
    try:
        from tests.rmq5.test_grpc_port import Client
        for m in g.members:  # every member routes a topic nobody wrote yet to the master (the client may ask any)
            c = Client(m.config["grpc"]["port"])
            try:
                assert {(q.broker.name, q.broker.id, q.broker.endpoints.addresses[0].port)
                        for q in c.route("tq-o-ha").message_queues} == {("metaq-7", 0,
                                                                         g.members[first].config["grpc"]["port"])}
            finally:
                c.close()
        o.call("producer", name="p", topics=["tq-o-ha"])
        o.call("send", producer="p", messages=[{"topic": "tq-o-ha", "body": "a%d" % i} for i in range(4)])
        g.members[first].kill()
        second = g.master(timeout=SESSION_MS / 1000.0 * 3 + 10, exclude=(first,))
        g.following(second, [i for i in others if i != second])
        for i in range(4):  # the client finds the new master at its next route refresh (every 30 s)
            o.until_ok("send", within=60, producer="p", messages=[{"topic": "tq-o-ha", "body": "b%d" % i}])
        want = sorted(["a%d" % i for i in range(4)] + ["b%d" % i for i in range(4)])
        assert sorted(b.decode() for b in text_records(g.members[second], "tq-o-ha")) == want
        o.call("consumer", name="c", group="g-o-ha", subscriptions={"tq-o-ha": ["TAG", "*"]})
        got = o.receive_all("c", 8, timeout=30)
        assert sorted(m["body"] for m in got) == want
    finally:
        o.close()
