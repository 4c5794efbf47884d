"""README "Health and readiness": after a failed flush (a real FUSE filesystem answering EIO to the fsync)
`/readyz` answers 503 with the reason, `/api/broker` says not ready, and `/healthz` still 200."""

import os

import pytest

from metaq.client.local import small_config
from tests.harness.fusefs import FaultMount
from tests.harness.http import request, with_http


@pytest.mark.fault
@pytest.mark.root
def test_readyz_is_503_after_a_failed_flush(broker_factory, tmp_path):
    fs = FaultMount(tmp_path).start()  # fails (does not skip) where FUSE cannot be mounted
    b = None
    try:
        b = broker_factory(with_http(small_config(os.path.join(fs.mountpoint, "data"),
                                                  store={"flush": "sync", "segment_size": 4 << 20})))
        with b.client() as c:
            c.put_ok("t-eio", b"durable", 0)
        r = request(b, "GET", "/readyz")
        assert r.status == 200 and r.text.startswith("ready"), r
        fs.set_fault("eio")
        with b.client() as c:
            failed = c.put("t-eio", b"not flushed", 0)
        assert failed.code == 500 and b"flush failed" in failed.body, failed
        assert [e for e in fs.events() if e["fault"] == "eio"], "the filesystem injected no EIO"
        r = request(b, "GET", "/readyz")
        assert r.status == 503 and r.text.startswith("not ready:") and "failed flush" in r.text, r
        broker = request(b, "GET", "/api/broker").json()
        assert broker["ready"] is False and "failed flush" in broker["not_ready_reason"], broker
        assert request(b, "GET", "/healthz").status == 200  # alive, not ready
        with b.client() as c:
            assert c.put("t-eio", b"refused", 0).code == 503  # what readiness warns of
    finally:
        if b is not None:
            b.kill()
        fs.stop()
