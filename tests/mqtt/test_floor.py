"""Retention's floor for the MQTT sessions' journal (``store.journals.MovingFloor`` over ``SessionTable.floor``), on a
real store: a session written again at the end holds the log from its old record until the new one is durable."""

from metaq.mqtt.follow import SavedSession, encode, encode_end, replay
from metaq.protocol.journaltopic import MQTT_SESSIONS_TOPIC
from metaq.store.journals import MovingFloor
from tests.harness.store import NOW, open_store


def _session(client_id, at_ms):
    return SavedSession(client_id, "alice", 5, 60, at_ms, False, [("a/#", 1, False, ["a"], True)], {}, [], [], [])


def _write(store, record):
    return store.put(MQTT_SESSIONS_TOPIC, 0, 0, record, NOW)


def test_a_rewritten_session_moves_the_floor_only_once_its_new_record_is_durable(tmp_path):
    store = open_store(tmp_path)
    try:
        _write(store, encode(_session("c1", 1)))
        store.mark_flushed(store.flush_log())
        floor = MovingFloor(store, lambda: replay(store).floor())
        first = floor()
        assert first == replay(store).sessions["c1"].position
        while store.written_position - first <= store.config.segment_size:  # other traffic: the log grows a segment
            store.put("other", 0, 0, b"o" * 1000, NOW)
        _write(store, encode(_session("c1", 2)))  # the port's rewrite: the session's record moves to the end
        moved = replay(store).sessions["c1"].position
        assert moved > first + store.config.segment_size
        assert store.flushed_position < store.written_position  # the new record is in the page cache only
        assert floor() == first  # a power cut would lose it: the old record must stay in the log
        assert floor() == first
        store.mark_flushed(store.flush_log())
        assert floor() == moved  # durable now: retention may delete the segment of the old one
    finally:
        store.close(NOW)


def test_a_lower_floor_counts_at_once_and_no_session_holds_nothing_once_durable(tmp_path):
    store = open_store(tmp_path)
    try:
        table = {"floor": 500}
        floor = MovingFloor(store, lambda: table["floor"])
        assert floor() == 500
        table["floor"] = 100  # a replay after a cut found an older record live: keep it at once
        assert floor() == 100
        _write(store, encode_end("c1"))
        table["floor"] = None  # the last session ended, its end record not flushed yet
        assert floor() == 100
        store.mark_flushed(store.flush_log())
        assert floor() is None
    finally:
        store.close(NOW)
