"""A commit-log block the disk cannot read (an unreadable sector: EIO on read, through a real FUSE filesystem).
The log is read through maps, and a read of such a page kills the process with SIGBUS; the start used to die so at
every attempt, nothing said (an attack review's finding). Now the start refuses with the file and the place."""

import glob
import os
import signal

import pytest

from metaq.client.local import small_config
from tests.harness.fusefs import FaultMount

pytestmark = pytest.mark.fault


def test_an_unreadable_block_is_named_at_start_instead_of_killing_the_broker_with_sigbus(broker_factory, tmp_path):
    fs = FaultMount(tmp_path).start()
    b = None
    try:
        data = os.path.join(fs.mountpoint, "data")
        b = broker_factory(small_config(data, store={"flush": "sync"}), workdir=tmp_path / "b")
        with b.client() as c:
            for i in range(200):
                c.put_ok("t-a", b"m%04d-" % i + b"x" * 1000, 0)
        assert b.stop() == 0
        seg = sorted(glob.glob(os.path.join(data, "commitlog", "*")))[0]
        fs.remount()  # the page cache of the mount's files goes with it
        fs.fail_reads(seg, 65536, 65536 + 4096)  # one bad 4 KiB block, under record 63
        with pytest.raises(RuntimeError):
            b.start(timeout=20)
        assert b.proc.returncode == 1, b.proc.returncode  # an orderly exit, not -SIGBUS
        assert b.proc.returncode != -signal.SIGBUS
        log = b.log_text(since_start=True)
        assert "cannot read %s at byte 65536" % seg in log and "I/O error" in log, log[-2000:]
        assert any(e["fault"] == "read-eio" for e in fs.events())
        os.unlink(fs.read_eio_flag)  # the block restored (a copy, a slave): the broker starts, nothing lost
        b.start()
        with b.client() as c:
            assert len(c.get_records("t-a", 0, 0, 1 << 30)) == 200
    finally:
        if b is not None:
            b.kill()
        fs.stop()
