"""Races on issue 19's topic table against a real broker: puts in flight while a topic is deleted."""

import threading

from metaq.client.local import small_config
from tests.harness.http import request, with_http


def test_a_put_acknowledged_around_a_delete_is_never_reused_by_the_re_created_topic(broker_factory, tmp_path):
    b = broker_factory(with_http(small_config(tmp_path / "data")))
    acked = []
    stop = threading.Event()

    def producer():
        with b.client() as c:
            while not stop.is_set():
                r = c.put("tRace", b"x" * 100, partition=0)
                if r.code == 200:
                    acked.append(int(r.body.split()[2]))

    with b.client() as c:
        c.put_ok("tRace", b"first", partition=0)
    threads = [threading.Thread(target=producer, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    while len(acked) < 200:
        pass
    gone = request(b, "DELETE", "/api/topics/tRace")
    assert gone.status == 200, gone
    stop.set()
    for t in threads:
        t.join(30)
    tombstone = gone.json()["next_offsets"]["0"]
    assert request(b, "PUT", "/api/topics/tRace?partitions=4").status == 201
    with b.client() as c:
        _id, _p, offset = c.put_ok("tRace", b"new topic", partition=0)
    assert max(acked) < tombstone <= offset, (max(acked), tombstone, offset)
