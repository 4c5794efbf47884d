"""The local recover journal: parked messages survive restarts, torn tails are ignored, done ones go away."""

import logging
import os

import pytest

from metaq import errors
from metaq.client.message import Message, Partition
from metaq.client.recover import RecoverStore


def received(body, offset, attribute=None, msg_id=None, flag=None):
    msg = Message("topic1", body, attribute)
    msg.partition, msg.offset = Partition(7, 2), offset
    msg.id = 1000 + offset if msg_id is None else msg_id
    msg.flag = (1 if attribute is not None else 0) if flag is None else flag
    return msg


def fields(msg):
    return (msg.topic, msg.body, msg.attribute, msg.id, msg.partition, msg.offset, msg.flag)


def test_parked_messages_survive_a_reopen_with_every_field(tmp_path):
    store = RecoverStore(tmp_path, "topic1", "grp")
    msgs = [received(b"a", 0), received(b"b" * 5000, 1, attribute="tag=x"), received(b"", 2, attribute="",
                                                                                       msg_id=-3, flag=0x101)]
    seqs = [store.append(m) for m in msgs]
    assert seqs == [1, 2, 3]
    store.close()
    again = RecoverStore(tmp_path, "topic1", "grp")
    assert [(seq, fields(m)) for seq, m in again.pending()] == list(zip(seqs, map(fields, msgs), strict=True))
    assert len(again) == 3
    again.close()


def test_a_message_without_partition_or_id_round_trips(tmp_path):
    with RecoverStore(tmp_path, "topic1", "grp") as store:
        store.append(Message("topic1", b"plain"))
    with RecoverStore(tmp_path, "topic1", "grp") as store:
        [(_seq, msg)] = store.pending()
        assert fields(msg) == ("topic1", b"plain", None, None, None, None, None)


def test_mark_done_removes_and_compacts(tmp_path):
    store = RecoverStore(tmp_path, "topic1", "grp")
    seqs = [store.append(received(b"m%d" % i, i)) for i in range(5)]
    store.mark_done(seqs[1])
    store.mark_done(seqs[3])
    store.mark_done(seqs[3])  # twice: ignored
    store.mark_done(999)  # unknown: ignored
    assert [m.body for _s, m in store.pending()] == [b"m0", b"m2", b"m4"]
    store.close()
    size_before = os.path.getsize(store.path)
    again = RecoverStore(tmp_path, "topic1", "grp")  # open compacts away the done records
    assert [m.body for _s, m in again.pending()] == [b"m0", b"m2", b"m4"]
    assert os.path.getsize(again.path) < size_before
    assert again.append(received(b"new", 9)) == 6  # sequence numbers never reused
    for seq, _m in again.pending():
        again.mark_done(seq)
    assert len(again) == 0 and os.path.getsize(again.path) == 0  # all done: the file is emptied
    again.close()


def test_a_torn_tail_is_ignored_with_a_warning(tmp_path, caplog):
    store = RecoverStore(tmp_path, "topic1", "grp")
    for i in range(3):
        store.append(received(b"x%d" % i, i))
    store.close()
    for shorter in (1, 7, 20, 40, 55):  # cut the last (56-byte) frame at several places
        with open(store.path, "r+b") as f:
            f.truncate(os.path.getsize(store.path) - shorter)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="metaq.client.recover"):
            again = RecoverStore(tmp_path, "topic1", "grp")
        assert [m.body for _s, m in again.pending()] == [b"x0", b"x1"]
        assert "torn tail" in caplog.text
        again.append(received(b"x2", 2))  # appending after a torn tail gives a readable file
        again.close()
        with RecoverStore(tmp_path, "topic1", "grp") as check:
            assert [m.body for _s, m in check.pending()] == [b"x0", b"x1", b"x2"]


def test_corruption_in_the_middle_keeps_a_copy(tmp_path, caplog):
    store = RecoverStore(tmp_path, "topic1", "grp")
    for i in range(3):
        store.append(received(b"y%d" % i, i))
    store.close()
    with open(store.path, "r+b") as f:
        data = bytearray(f.read())
        data[8 + 38 + 2 + 6 + 8 + 40] ^= 0xFF  # a byte inside the second frame
        f.seek(0)
        f.write(data)
    with caplog.at_level(logging.WARNING, logger="metaq.client.recover"):
        again = RecoverStore(tmp_path, "topic1", "grp")
    assert [m.body for _s, m in again.pending()] == [b"y0"]
    damaged = [n for n in os.listdir(tmp_path) if ".damaged-" in n]
    assert len(damaged) == 1 and "kept as" in caplog.text
    assert (tmp_path / damaged[0]).read_bytes() == bytes(data)
    again.close()


def test_stores_are_per_topic_and_group(tmp_path):
    with RecoverStore(tmp_path, "topic1", "g1") as a, RecoverStore(tmp_path, "topic1", "g2") as b:
        a.append(received(b"for g1", 0))
        assert len(b) == 0


def test_bad_names_and_closed_store(tmp_path):
    with pytest.raises(errors.ClientError):
        RecoverStore(tmp_path, "../escape", "grp")
    with pytest.raises(errors.ClientError):
        RecoverStore(tmp_path, "topic1", "a/b")
    store = RecoverStore(tmp_path, "topic1", "grp")
    store.close()
    with pytest.raises(ValueError):
        store.append(received(b"late", 0))
