"""Master/slave test helpers: a master's config, a ``sync`` master with its slave, stats, waiting for a slave to
catch up, identical logs, a mixed load; the frames a stand-in peer on the replication port reads; a stand-in master's
handshake."""

import os
import random

from metaq.auth import proofs
from metaq.client.local import free_port, small_config
from metaq.protocol import events as ev
from metaq.protocol import replication as rp
from metaq.protocol import stats as stats_codec
from metaq.protocol.stream import NEED_DATA
from tests.harness.broker import consume_all, wait_for


def master_config(workdir, rport, **replication):
    return small_config(os.path.join(str(workdir), "data"), replication=dict({"port": rport}, **replication))


def sync_pair(broker_factory, tmp_path, sync_timeout_ms):
    """A ``sync`` master (``tmp_path/m``) and its slave 1 (``tmp_path/s``), returned once the slave is connected."""
    rport = free_port()
    master = broker_factory(master_config(tmp_path / "m", rport, mode="sync", sync_timeout_ms=sync_timeout_ms),
                            workdir=tmp_path / "m")
    slave = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                           extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    wait_for(lambda: stats(master)["replication_slaves"] == "1", 10, "slave connected")
    return master, slave


def stats(b):
    with b.client() as c:
        return c.stats_dict()


def commitlog(b):
    d = os.path.join(b.data_dir, "commitlog")
    out = {}
    for name in sorted(os.listdir(d)):
        if not (len(name) == 20 and name.isdigit()):
            continue  # a next segment being prepared ahead (*.prepared) exists on either side at its own time
        with open(os.path.join(d, name), "rb") as f:
            out[name] = f.read()
    return out


def partition_ends(b):
    """``{(topic, partition): max offset}`` as ``stats offsets`` gives it (what a reader of ``b`` is answered)."""
    with b.client() as c:
        return {(r.topic, r.partition): r.max_offset for r in stats_codec.parse_offsets(c.stats("offsets").encode())}


def caught_up(master, slave):
    """Until the slave holds the master's whole flushed log and its partitions answer the master's ends: their
    indexes follow the slave's log a step at a time after each flush round, not with the copy."""
    def check():
        m, s = stats(master), stats(slave)
        if not (m["log_end_position"] == m["log_flushed_position"] == s["log_end_position"]
                == s["log_flushed_position"]):
            return False
        theirs, ours = partition_ends(master), partition_ends(slave)
        return all(ours.get(key, 0) == end for key, end in theirs.items())
    wait_for(check, 20, lambda: "slave caught up: master %s slave %s; partition ends %s / %s" % (
        stats(master)["log_end_position"], stats(slave)["log_end_position"], partition_ends(master),
        partition_ends(slave)))


def assert_identical(master, slave):
    """The slave's log is the master's, byte for byte, and so are its partitions once their indexes (which follow
    the slave's log a step at a time after each flush round, not with the copy) hold the caught-up log."""
    caught_up(master, slave)
    m, s = commitlog(master), commitlog(slave)
    assert sorted(m) == sorted(s)
    for name in m:
        assert m[name] == s[name], "segment %s differs" % name
    with master.client() as mc, slave.client() as sc:
        wait_for(lambda: mc.stats("offsets") == sc.stats("offsets"), 30,
                 lambda: "the slave's partitions at the master's ends:\n%s\n%s" % (mc.stats("offsets"),
                                                                                   sc.stats("offsets")))
        assert mc.stats("offsets") == sc.stats("offsets")
        for line in mc.stats("offsets").split("\r\n")[1:-2]:
            topic, _p, part = line.split()[:3]
            part = int(part)
            assert consume_all(mc, topic, part) == consume_all(sc, topic, part)
            assert mc.call(ev.Offset(topic, "g", part, 0, mc.opaque())).body == \
                sc.call(ev.Offset(topic, "g", part, 0, sc.opaque())).body
        assert mc.stats("topics") == sc.stats("topics")


def mixed_load(master, n=300, seed=1):
    rnd = random.Random(seed)
    acked = []
    with master.client() as c:
        for i in range(n):
            topic = rnd.choice(["t-a", "t-b", "other"])
            size = rnd.choice([10, 200, 5000, 60000])
            body = (b"%d-" % i) * (size // 4 + 1)
            acked.append((topic,) + c.put_ok(topic, body[:size], attribute="a%d" % i if i % 3 == 0 else None))
    return acked


def frames_of(sock, parser):
    """Each replication-stream event ``parser`` makes of what ``sock`` receives, until the other side closes: the
    read loop of a stand-in member or home on the replication port."""
    while True:
        data = sock.recv(65536)
        if not data:
            return
        parser.receive_data(data)
        while (event := parser.next_event()) is not rp.NEED_DATA:
            yield event


def empty_master_handshake(sock):
    """A stand-in master's side of the handshake on accepted ``sock``, with no secret: its CHALLENGE, the slave's
    PROOF and HELLO read, then its PROOF and the EPOCHS of an empty log ("our logs agree at 0", its end 0)."""
    sock.settimeout(10)
    parser = rp.ReplicationParser()
    sock.sendall(rp.serialize(rp.Challenge(False, proofs.new_nonce())))
    got = []
    while len(got) < 2:  # the slave's PROOF and HELLO
        event = parser.next_event()
        if event is NEED_DATA:
            parser.receive_data(sock.recv(65536))
        else:
            got.append(event)
    assert [type(e) for e in got] == [rp.Proof, rp.Hello], got
    sock.sendall(rp.serialize(rp.Proof("", "")) + rp.serialize(rp.Epochs(0, 0, ((0, 0, 0),))))
