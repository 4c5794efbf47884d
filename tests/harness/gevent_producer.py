"""A producer under gevent monkey-patching, in a subprocess of its own."""

GEVENT_SCRIPT = r"""
from gevent import monkey; monkey.patch_all()
import sys, gevent
from metaq.client import Message, Producer
kwargs = {"zk_connect": sys.argv[2]} if len(sys.argv) > 2 else {"brokers": [sys.argv[1]]}
with Producer(**kwargs) as producer:
    assert producer.send(Message("tgevent", b"first")).success
    def worker(n):
        futures = [producer.send_async(Message("tgevent", b"%d" % n)) for _ in range(100)]
        sync = [producer.send(Message("tgevent", b"s")) for _ in range(10)]
        return all(f.result(20).success for f in futures) and all(r.success for r in sync)
    jobs = [gevent.spawn(worker, n) for n in range(4)]
    gevent.joinall(jobs, timeout=60)
    assert all(j.value for j in jobs), [j.value for j in jobs]
print("OK")
"""


def run_gevent_script(*args):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", GEVENT_SCRIPT, *args], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stderr[-3000:]
