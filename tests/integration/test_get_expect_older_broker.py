"""A consumer of this version against a broker from before the get's ``expect`` (a rolling upgrade: clients
first): the broker answers the 9-token get with a 400; the consumer says so once and reads on without the check.

The older broker is this repository's own code at the commit before the extension (``git archive``), run as its
own process: the real thing an upgrade meets.
"""

import io
import os
import subprocess
import tarfile
import threading

import pytest

from metaq.client.consumer import Consumer
from metaq.client.local import BrokerProcess, small_config
from tests.harness.broker import wait_for

#: The last commit whose broker knows no ``expect`` (the extension came in the next one).
BEFORE_EXPECT = "5e47742"
#: The last commit whose broker knows ``expect`` but not get_tags' ``:passed`` (events.GetTags).
BEFORE_PASSED = "0128d57"
#: The last commit whose broker knows ``get_prio`` but not its expects (priorities/wire.py).
BEFORE_PRIO_EXPECTS = "83bad7a"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def older_broker(tmp_path):
    yield from broker_at(tmp_path, BEFORE_EXPECT)


@pytest.fixture
def broker_before_passed(tmp_path):
    yield from broker_at(tmp_path, BEFORE_PASSED)


@pytest.fixture
def broker_before_prio_expects(tmp_path):
    yield from broker_at(tmp_path, BEFORE_PRIO_EXPECTS)


def broker_at(tmp_path, commit):
    try:
        tar = subprocess.run(["git", "-C", ROOT, "archive", commit, "metaq"], check=True,
                             capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip("the older broker's code is not in this clone's history (%s)" % exc)
    code = tmp_path / "older"
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(code)
    b = BrokerProcess(tmp_path / "b", small_config(tmp_path / "b" / "data"))
    os.makedirs(b.workdir, exist_ok=True)
    os.environ["PYTHONPATH"], saved = str(code), os.environ.get("PYTHONPATH")
    try:
        b.start(timeout=60)
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    yield b
    b.stop()


def test_a_consumer_reads_on_from_a_broker_that_knows_no_expect(older_broker, caplog):
    with older_broker.client() as c:
        c.send(b"get t-old g 0 0 1000 0 0:1 7\r\n")  # the older grammar: not a get it knows
        r = c.read_event()
        assert r.code == 400 and b"get needs 7 or 8 tokens" in r.body, r
        for k in range(30):
            c.put_ok("t-old", b"o-%d" % k, 0)
    got, lock = [], threading.Lock()

    def handle(message):
        with lock:
            got.append(message.body)

    consumer = Consumer("g-old", brokers=["meta://127.0.0.1:%d" % older_broker.port], long_poll_ms=200)
    consumer.subscribe("t-old", handle)
    consumer.start()
    try:
        wait_for(lambda: len(got) >= 30, 30, lambda: "30 messages from the older broker: %r" % got)
        with older_broker.client() as c:
            for k in range(30, 40):  # and on: gets after the first refusal carry no expect
                c.put_ok("t-old", b"o-%d" % k, 0)
        wait_for(lambda: len(got) >= 40, 30, lambda: "40 messages: %r" % got)
    finally:
        consumer.close()
    assert got == [b"o-%d" % k for k in range(40)]
    warned = [r for r in caplog.records if "does not check a get's last record" in r.getMessage()]
    assert 1 <= len(warned) <= 2  # once per fetcher of partition 0 (the others read nothing to check)


def test_a_tag_filtered_consumer_reads_on_from_a_broker_that_names_no_passed_record(broker_before_passed, caplog):
    b = broker_before_passed
    with b.client() as c:
        c.send(b"get_tags t-old g 0 0 1000 a 0 :passed 7\r\n")  # its grammar: an expect it cannot parse
        r = c.read_event()
        assert r.code == 400 and b"invalid expect" in r.body, r
        for k in range(30):
            c.put_ok("t-old", b"o-%d" % k, 0, attribute="ab"[k % 2])
    got, lock = [], threading.Lock()

    def handle(message):
        with lock:
            got.append(message.body)

    consumer = Consumer("g-old", brokers=["meta://127.0.0.1:%d" % b.port], long_poll_ms=200)
    consumer.subscribe("t-old", handle, filter="a")
    consumer.start()
    try:
        wait_for(lambda: len(got) >= 15, 30, lambda: "15 messages from the older broker: %r" % got)
        with b.client() as c:
            for k in range(30, 40):  # and on: its gets keep the plain expect, checked as before
                c.put_ok("t-old", b"o-%d" % k, 0, attribute="ab"[k % 2])
        wait_for(lambda: len(got) >= 20, 30, lambda: "20 messages: %r" % got)
    finally:
        consumer.close()
    assert got == [b"o-%d" % k for k in range(0, 40, 2)]
    warned = [r for r in caplog.records if "does not name the records a get_tags passed over" in r.getMessage()]
    assert warned and not any("does not check a get's last record" in r.getMessage() for r in caplog.records)


def test_a_priority_consumer_reads_on_from_a_broker_that_checks_no_get_prio_expects(broker_before_prio_expects,
                                                                                   caplog):
    from tests.client.test_priorities import create

    b = broker_before_prio_expects
    with b.client() as c:
        create(c, "t-old", partitions=1, priorities=2)
        c.send(b"get_prio t-old g 0 0,0 1000 0 -,- 7\r\n")  # its grammar: not a get_prio it knows
        r = c.read_event()
        assert r.code == 400 and b"get_prio needs 7 or 8 tokens" in r.body, r
        for k in range(20):
            assert c.put_prio("t-old", b"o-%d" % k, k % 2, partition=0).code == 200
    got, lock = [], threading.Lock()

    def handle(message):
        with lock:
            got.append(message.body)

    consumer = Consumer("g-old", brokers=["meta://127.0.0.1:%d" % b.port], long_poll_ms=200)
    consumer.subscribe("t-old", handle, priorities=2)
    consumer.start()
    try:
        wait_for(lambda: len(got) >= 20, 30, lambda: "20 messages from the older broker: %r" % got)
        with b.client() as c:
            for k in range(20, 30):  # and on: get_prios after the first refusal carry no expects
                assert c.put_prio("t-old", b"o-%d" % k, k % 2, partition=0).code == 200
        wait_for(lambda: len(got) >= 30, 30, lambda: "30 messages: %r" % got)
    finally:
        consumer.close()
    assert sorted(got[:20]) == sorted(b"o-%d" % k for k in range(20)) and len(set(got)) == len(got) == 30
    warned = [r for r in caplog.records if "does not check a get_prio's last records" in r.getMessage()]
    assert len(warned) == 1  # once for the fetcher of partition 0
