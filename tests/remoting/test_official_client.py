"""The official Apache RocketMQ client (PyPI rocketmq==0.4.4, C++ core) against metaq, end to end.

Each client runs in a subprocess (``bench/rocketmq_peer.py``) pointed at the broker's
remoting port as its name server.
"""

from itertools import pairwise

import pytest

from tests.harness.broker import consume_all
from bench.rocketmq_peer import finish_peer, run_peer, start_peer
from metaq.client.local import ns_of
from tests.harness.rocketmq import committed, received, require_official_client

pytestmark = pytest.mark.slow

FAST = {"store": {"flush": "async", "flush_interval_ms": 50}}


@pytest.fixture(autouse=True)
def _official_client():
    require_official_client()


def test_thousand_messages_over_several_queues_reach_a_push_consumer(rmq_factory, tmp_path):
    b = rmq_factory(**FAST)
    ns = ns_of(b)
    sent = run_peer(tmp_path / "p", "produce", "--ns", ns, "--topic", "tK", "--count", 1000, "--tags", "TagK")
    sends = [line for line in sent if "msg_id" in line]
    assert len(sends) == 1000 and all(s["status"] == 0 for s in sends)
    lines = run_peer(tmp_path / "c", "consume", "--ns", ns, "--topic", "tK", "--group", "CGK", "--expect", 1000,
                     "--timeout", 60)
    got = received(lines)
    assert sorted(m["body"] for m in got) == sorted("m-%d" % i for i in range(1000))
    assert {m["queue_id"] for m in got} == {0, 1, 2, 3}
    assert all(m["tags"] == "TagK" and m["keys"] == "m-key-%s" % m["seq"] for m in got)
    assert {m["id"] for m in got} == {s["msg_id"] for s in sends}  # the client's UNIQ_KEY survives the store


def test_committed_offsets_survive_a_consumer_restart(rmq_factory, tmp_path):
    b = rmq_factory(**FAST)
    ns = ns_of(b)
    run_peer(tmp_path / "p", "produce", "--ns", ns, "--topic", "tC", "--count", 200, "--quiet")
    first = received(run_peer(tmp_path / "c1", "consume", "--ns", ns, "--topic", "tC", "--group", "CGC",
                              "--stop-after", 80, "--timeout", 30))
    assert len(first) >= 80
    offsets = committed(b, "CGC", "tC", 4)  # what the first consumer committed on shutdown
    assert all(o is not None for o in offsets.values()), offsets
    second = received(run_peer(tmp_path / "c2", "consume", "--ns", ns, "--topic", "tC", "--group", "CGC",
                               "--expect", 200 - sum(offsets.values()), "--timeout", 30, "--linger", 1.0))
    # nothing below the last commit comes again, and everything at or past it does
    assert all(m["queue_offset"] >= offsets[m["queue_id"]] for m in second)
    assert {m["body"] for m in first} | {m["body"] for m in second} == {"m-%d" % i for i in range(200)}
    assert len(second) == 200 - sum(offsets.values())


def test_a_failing_handler_gets_the_message_again_then_it_lands_in_the_dlq(rmq_factory, tmp_path):
    b = rmq_factory(remoting={"max_reconsume_times": 2, "send_back_delay_level": 0}, **FAST)
    ns = ns_of(b)
    run_peer(tmp_path / "p", "produce", "--ns", ns, "--topic", "tF", "--count", 5)
    lines = received(run_peer(tmp_path / "c", "consume", "--ns", ns, "--topic", "tF", "--group", "CGF",
                              "--fail", "m-2", "--expect", 4, "--linger", 3.0))
    poison = [m for m in lines if m["body"] == "m-2"]
    assert [m["reconsume_times"] for m in poison] == [0, 1, 2]  # delivered, then retried twice
    assert all(m["topic"] == "tF" for m in poison)  # the client restores the topic from RETRY_TOPIC
    assert sorted(m["body"] for m in lines if m["body"] != "m-2") == ["m-0", "m-1", "m-3", "m-4"]
    with b.client() as text:
        [dead] = consume_all(text, "%DLQ%CGF", 0)
    assert dead.payload == b"m-2" and dead.attribute.startswith("\x02")  # no tags; properties follow \x02
    assert "RETRY_TOPIC\x01tF\x02" in dead.attribute


def test_delayed_messages_arrive_no_earlier_than_their_delay(rmq_factory, tmp_path):
    b = rmq_factory(**FAST)
    ns = ns_of(b)
    proc = start_peer(tmp_path / "c", "consume", "--ns", ns, "--topic", "tDelay", "--group", "CGDL", "--expect", 4,
                      "--timeout", 30)
    sent = [s for s in run_peer(tmp_path / "p", "produce", "--ns", ns, "--topic", "tDelay", "--count", 3,
                                "--delay-level", 2) if "msg_id" in s]  # level 2 = 5 s
    sent += [s for s in run_peer(tmp_path / "p2", "produce", "--ns", ns, "--topic", "tDelay", "--count", 1,
                                 "--prefix", "now") if "msg_id" in s]
    got = {m["body"]: m["t"] for m in received(finish_peer(proc))}
    assert set(got) == {"m-0", "m-1", "m-2", "now-0"}
    sent_at = {"m-%d" % s["i"]: s["t"] for s in sent[:3]}
    for body, t in sent_at.items():
        assert got[body] - t >= 5.0 - 0.05, (body, got[body] - t)
    assert got["now-0"] < min(got[b] for b in sent_at)  # undelayed traffic is not held up


def test_retry_honours_rocketmq_delay_levels(rmq_factory, tmp_path):
    """Without send_back_delay_level, a retry waits delay level 3 + reconsume times, as in RocketMQ
    (10 s with the default levels; 3 s with the levels configured here; a level past the last counts as the last).
    The consumer runs for a fixed time from its start, which includes its first rebalance and pull: room for a
    slow start before the third delivery, and a fourth (4 s after the third) allowed when the start was quick."""
    b = rmq_factory(delay={"levels": "1s 1s 3s 4s"}, **FAST)
    ns = ns_of(b)
    run_peer(tmp_path / "p", "produce", "--ns", ns, "--topic", "tD", "--count", 1)
    lines = received(run_peer(tmp_path / "c", "consume", "--ns", ns, "--topic", "tD", "--group", "CGD",
                              "--fail", "m-0", "--expect", 1, "--timeout", 13))
    times = [m["t"] for m in lines if m["body"] == "m-0"]
    assert len(times) in (3, 4), lines  # first delivery, after 3 s (level 3), after 4 s more (level 4), ...
    assert times[1] - times[0] >= 3.0 - 0.05 and times[2] - times[1] >= 4.0 - 0.05
    assert all(later - earlier >= 4.0 - 0.05 for earlier, later in pairwise(times[2:]))  # (level 5: 4 s)


def test_the_readme_example_runs_as_written(rmq_factory, tmp_path):
    import pathlib
    import re
    import subprocess
    import sys

    from bench.rocketmq_peer import peer_env

    section = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "rocketmq.md").read_text()
    [code] = re.findall(r"```python\n(.*?)```", section, re.S)
    b = rmq_factory(**FAST)
    script = code.replace("127.0.0.1:9876", ns_of(b)) + (
        "\nimport os, sys, time\ntime.sleep(3)\nconsumer.shutdown()\nsys.stdout.flush()\nos._exit(0)\n")
    r = subprocess.run([sys.executable, "-c", script], env=peer_env(tmp_path / "home"), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "SendStatus.OK" in r.stdout
    assert "orders b'created' b'order-17' b'order 17 created' 0" in r.stdout
