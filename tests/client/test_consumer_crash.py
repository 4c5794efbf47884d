"""kill -9 of a consuming process: a restarted consumer resumes exactly at the last committed offset."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from metaq.client.consumer import Consumer
from metaq.protocol import events as ev
from tests.harness.collector import Collector

SCRIPT = textwrap.dedent("""
    import sys, time
    from metaq.client.consumer import Consumer

    def handle(message):
        print(message.offset, flush=True)
        time.sleep(0.01)

    consumer = Consumer("crash", brokers=[sys.argv[1]], commit_interval=0.3, long_poll_ms=1000,
                        recover_dir=sys.argv[2])
    consumer.subscribe("topic1", handle).start()
    time.sleep(60)
""")


@pytest.mark.fault
def test_restart_after_kill_resumes_at_the_last_commit(broker, tmp_path):
    with broker.client() as c:
        for i in range(300):
            c.put_ok("topic1", b"k%d" % i, 0)
    url = "meta://127.0.0.1:%d" % broker.port
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, url, str(tmp_path)], stdout=subprocess.PIPE, env=env)
    try:
        seen = []
        while len(seen) < 150:  # let it consume (and commit at least once) part of the way
            line = proc.stdout.readline()
            assert line, "consumer process ended early"
            seen.append(int(line))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    seen.extend(int(line) for line in proc.stdout.read().split())
    assert seen == list(range(len(seen)))
    with broker.client() as c:
        reply = c.call(ev.QueryOffset("crash", "topic1", 0, 1))
    assert reply.code == 200, reply
    committed = int(reply.body)
    assert 0 < committed <= len(seen) < 300

    handler = Collector()
    with Consumer("crash", brokers=[url], long_poll_ms=1000, recover_dir=tmp_path) as consumer:
        consumer.subscribe("topic1", handler).start()
        msgs = handler.wait_for(300 - committed)
        time.sleep(0.2)
        assert [m.offset for m in handler.messages] == list(range(committed, 300))  # from the commit, once each
        assert msgs[0].body == b"k%d" % committed
