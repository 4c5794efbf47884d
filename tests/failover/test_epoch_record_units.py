"""The decisions of the group's epoch record (issue 66 point 8), without a network: who took part in the latest
recorded epoch, who began it, and what a node may hold (``metaq.server.replication.epochrecord``)."""

import json

import pytest

from metaq.server.replication import limits as replication_limits
from metaq.server.replication import epochrecord
from metaq.store.epochs import leads_record, took_part

ROOT = (0, 0, 0)
E1 = (1, 0, 11)
E2 = (2, 70, 22)


def test_a_member_that_holds_the_latest_epoch_took_part():
    assert took_part([E1, E2], False, E2)  # a slave that copied up to its start
    assert took_part([E1], True, None)  # no record: nothing to be behind of
    assert not took_part([E1], True, E2)  # the old master, down while epoch 2 began elsewhere
    assert not took_part([ROOT], False, E2)  # an emptied data dir
    assert not took_part([E1, (2, 70, 99)], True, E2)  # the same number, another origin: another master's epoch


def test_an_unrecorded_later_epoch_of_its_own_counts_as_taking_part():
    assert took_part([E1, (3, 70, 33)], True, E2)  # began 3 at 70 (dropping 2's empty entry), record write failed
    assert not took_part([E1, (3, 70, 33)], False, E2)  # a copied one proves nothing about the record


def test_only_the_member_that_began_the_latest_epoch_leads_it():
    assert leads_record([E1, E2], True, E2)
    assert not leads_record([E1, E2], False, E2)  # the old master, caught up since: it follows, never leads
    assert not leads_record([E1], True, E2)
    assert leads_record([E1], True, None)


def test_a_node_parses_and_what_is_wrong_is_named():
    good = {"epochs": [{"epoch": 2, "start": 70, "origin": 22, "member": "meta://a:1", "replication": "a:2"}]}
    (entry,) = epochrecord.parse(json.dumps(good).encode())
    assert epochrecord.key(entry) == E2 and entry["replication"] == "a:2"
    for bad, why in ((b"{", "not JSON"), (b"[]", "no list"), (b'{"epochs": [{"epoch": true, "start": 1, '
                                                                 b'"origin": 1}]}', "an entry")):
        with pytest.raises(ValueError, match=why):
            epochrecord.parse(bad)


def test_a_node_nested_too_deep_or_with_integers_out_of_range_is_unreadable_not_fatal():
    for bad in (b"[" * 32000, b'{"epochs": ' + b"[" * 32000):
        with pytest.raises(ValueError, match="nested too deep|not JSON"):
            epochrecord.parse(bad)
    for epoch in (-1, 2 ** 63, 2 ** 63 - 1):
        data = json.dumps({"epochs": [{"epoch": epoch, "start": 0, "origin": 1}]}).encode()
        if epoch == 2 ** 63 - 1:
            assert epochrecord.parse(data)[0]["epoch"] == epoch  # the last one in range
        else:
            with pytest.raises(ValueError, match="2\\*\\*63"):
                epochrecord.parse(data)


def test_a_node_past_its_byte_limit_is_refused_at_the_limit_it_is_read():
    entry = {"epoch": 1, "start": 0, "origin": 1, "member": "m", "replication": None}
    data = json.dumps({"epochs": [entry]}).encode()
    padded = data[:-1] + b" " * (replication_limits.MAX_EPOCH_RECORD_BYTES - len(data)) + b"}"
    assert len(padded) == replication_limits.MAX_EPOCH_RECORD_BYTES and epochrecord.parse(padded)
    with pytest.raises(ValueError, match="MAX_EPOCH_RECORD_BYTES"):
        epochrecord.parse(padded[:-1] + b" }")


def test_only_the_latest_recorded_epochs_are_kept_in_a_node():
    entries = [{"epoch": e, "start": e, "origin": e, "member": "m", "replication": None}
               for e in range(1, replication_limits.MAX_RECORDED_EPOCHS + 2)]
    parsed = epochrecord.parse(json.dumps({"epochs": entries}).encode())
    assert (len(parsed) == replication_limits.MAX_RECORDED_EPOCHS
            and parsed[-1]["epoch"] == replication_limits.MAX_RECORDED_EPOCHS + 1)


def test_the_record_in_zookeeper_keeps_the_latest_and_refuses_an_older_epoch(zk_connect):
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=zk_connect)
    zk.start()
    try:
        record = epochrecord.EpochRecord(zk, "/meta/brokers/ids/7")
        assert record.read() == ([], None) and record.next_epoch(4) == 5
        zk.create(record.path, b"not json", makepath=True)  # unreadable: counted as none, replaced by the next add
        assert record.read()[0] == [] and record.latest() is None
        for e in range(1, replication_limits.MAX_RECORDED_EPOCHS + 2):
            assert record.add({"epoch": e, "start": e, "origin": e, "member": "m", "replication": None}) is None
        entries, _version = record.read()
        assert len(entries) == replication_limits.MAX_RECORDED_EPOCHS and entries[0]["epoch"] == 2
        newest = entries[-1]
        assert record.add(dict(newest)) is None  # the same entry again: already there
        assert record.add({"epoch": newest["epoch"], "start": 0, "origin": 5, "member": "x",
                           "replication": None}) == newest  # not added: another member's was first
        assert record.next_epoch(1) == newest["epoch"] + 1
        later = {"epoch": newest["epoch"] + 1, "start": 0, "origin": 6, "member": "y", "replication": None}
        assert record.add(later, checked=entries[-2]) == newest  # decided on an older latest: not added
        assert record.add(later, checked=newest) is None and record.latest() == later
    finally:
        zk.stop()
        zk.close()


def test_in_sync_mode_a_member_of_the_in_sync_set_of_the_latest_recorded_epoch_may_be_elected():
    from metaq.server.replication.election import in_sync_at

    latest = {"epoch": 5, "start": 70, "origin": 55}
    insync = {"epoch": 5, "master": 1, "members": [1, 2]}
    assert in_sync_at("sync", 2, insync, latest)  # puts of epoch 5 waited for member 2
    assert in_sync_at("sync", 2, dict(insync, epoch=6), latest)  # a later term's set (its record write failed)
    assert not in_sync_at("sync", 3, insync, latest)  # not in the set
    assert not in_sync_at("sync", 2, dict(insync, epoch=4), latest)  # the set of an earlier epoch
    assert not in_sync_at("async", 2, insync, latest)  # async: acknowledged puts waited for nobody
    assert not in_sync_at("sync", 2, None, latest) and not in_sync_at("sync", 2, insync, None)
