"""bench/gevent_floor.py, the runtime's floor beside the durable rows (bench/bench_durable.py --floor): it must do
the work it stands for — every put's body copied into its map before its ack — or the table compares
metaq with a server that does less than it claims."""

import mmap
import os

import pytest

from bench import run as bench_run
from bench.gevent_floor import FloorServer
from metaq.client.local import free_port

pytestmark = [pytest.mark.integration]


def test_the_floor_acks_each_put_after_its_body_is_in_the_map(tmp_path):
    floor = FloorServer(free_port(), str(tmp_path))
    try:
        for depth in (1, 8, 64):  # opaques of one and two digits: frames of two lengths, split by their length field
            assert bench_run.pipelined_puts(floor.port, 200, depth) > 0  # every reply a result 200, none missing
        with open(tmp_path / "floor.log", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as log:
            written = 3 * 200 * bench_run.MSG
            assert log[:written] == b"p" * written and log[written:written + 1] == b"\0"  # the bodies, nothing else
    finally:
        floor.stop()
    assert floor.proc.returncode is not None and not os.path.exists(tmp_path / "floor.log")
