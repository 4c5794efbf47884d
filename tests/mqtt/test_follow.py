"""The sessions' log records and the table they build (metaq.mqtt.follow): pure, no broker."""

from metaq.mqtt.follow import (Retained, SavedGroup, SavedSession, SavedWill, SessionTable, decode, encode, encode_end,
                               encode_group, encode_group_end, encode_retained, encode_unretained, encode_will,
                               encode_will_end)


def _saved(client_id="c1", at_ms=1000, expiry_s=60, connected=False):
    return SavedSession(client_id, "alice", 5, expiry_s, at_ms, connected, [("a/#", 1, False, ["a"], True, 11)],
                        {("a", 0): 7}, [3], [(5, "publish", 1, "a", 0, 6)], [("$share/g/a/#", 1, None)])


def test_a_session_record_round_trips():
    client_id, back = decode(encode(_saved()))
    assert client_id == "c1"
    assert (back.user, back.version, back.expiry_s, back.subscriptions, back.cursors, back.qos2, back.inflight,
            back.shared) == ("alice", 5, 60, [("a/#", 1, False, ["a"], True, 11)], {("a", 0): 7}, [3],
                             [(5, "publish", 1, "a", 0, 6)], [("$share/g/a/#", 1, None)])
    old = (b'{"k":"s","c":"c0","u":null,"v":4,"e":null,"at":1,"on":false,"subs":[["a/#",1,false,["a"],false]],'
           b'"cur":[],"q2":[],"inf":[],"sh":[["$share/g/a/#",1]]}')  # written before subscription identifiers
    _id, back = decode(old)
    assert (back.subscriptions, back.shared) == ([("a/#", 1, False, ["a"], False, None)], [("$share/g/a/#", 1, None)])


def test_a_record_of_non_ascii_names_round_trips_and_one_written_with_escapes_still_reads():
    saved = _saved("capteur-é", connected=True)
    saved.subscriptions = [("maison/séjour/#", 1, False, ["maison"], False, None)]
    data = encode(saved)
    assert "capteur-é".encode("utf-8") in data  # UTF-8 as it is: no longer than an escaped record
    client_id, back = decode(data)
    assert (client_id, back.subscriptions) == ("capteur-é", [("maison/séjour/#", 1, False, ["maison"], False, None)])
    escaped = (b'{"k":"s","c":"capteur-\\u00e9","u":null,"v":4,"e":null,"at":1,"on":false,"subs":[],"cur":[],'
               b'"q2":[],"inf":[],"sh":[],"cq":[]}')  # as the json module wrote records
    assert decode(escaped)[0] == "capteur-é"
    assert decode(encode_end("capteur-é")) == ("capteur-é", None)


def test_the_last_record_of_a_client_is_its_session_and_an_end_drops_it():
    t = SessionTable()
    t.apply(10, encode(_saved(at_ms=1)))
    t.apply(20, encode(_saved(at_ms=2)))
    t.apply(30, encode(_saved("c2")))
    assert t.sessions["c1"].at_ms == 2 and t.floor() == 20
    t.apply(40, encode_end("c1"))
    assert list(t.sessions) == ["c2"] and t.floor() == 30
    t.apply(50, b"not a record")  # passed over, logged
    assert list(t.sessions) == ["c2"]


def test_retained_records_set_replace_and_clear():
    t = SessionTable()
    t.apply(5, encode_retained(Retained("a/x", "a", 1, b"12345", 1)))
    t.apply(6, encode_retained(Retained("a/x", "a", 1, b"123", 2)))
    t.apply(7, encode_retained(Retained("a/y", "a", 0, b"\n\x00binary", 3)))
    assert t.retained["a/x"].data == b"123" and t.retained["a/y"].data == b"\n\x00binary"
    assert t.retained_bytes == 3 + 8 and t.floor() == 6
    t.apply(8, encode_unretained("a/x"))
    assert list(t.retained) == ["a/y"] and t.retained_bytes == 8


def test_shared_group_records_keep_the_last_positions_and_an_end_drops_them():
    t = SessionTable()
    t.apply(5, encode_group(SavedGroup("g", "jobs/#", ["jobs"], {("jobs", 0): 3, ("jobs", 1): 0}, 1)))
    t.apply(9, encode_group(SavedGroup("g", "jobs/#", ["jobs"], {("jobs", 0): 7, ("jobs", 1): 2}, 2)))
    t.apply(12, encode_group(SavedGroup("h", "#", ["jobs", "b"], {("b", 0): 1}, 3)))
    g = t.groups[("g", "jobs/#")]
    assert (g.topics, g.cursors, g.at_ms, g.position) == (["jobs"], {("jobs", 0): 7, ("jobs", 1): 2}, 2, 9)
    assert sorted(t.groups[("h", "#")].topics) == ["b", "jobs"] and t.floor() == 9  # retention keeps the last
    t.apply(13, encode_group_end("g", "jobs/#"))
    assert list(t.groups) == [("h", "#")] and t.floor() == 12
    t.apply(14, b'{"k":"g","n":"broken"}')  # passed over, logged
    assert list(t.groups) == [("h", "#")]


def test_expiry_and_the_age_bound():
    s = _saved(at_ms=0, expiry_s=10)
    assert not s.expired(9_999, 3600) and s.expired(10_000, 3600)
    old = _saved(at_ms=0, expiry_s=None)  # MQTT 3.1.1: only the age bound
    assert not old.expired(3_599_999, 3600) and old.expired(3_600_000, 3600)
    forever = _saved(at_ms=0, expiry_s=0xFFFFFFFF)
    assert not forever.expired(10**9, 10**7) and forever.expired(10**10, 10**7)
    assert not _saved(at_ms=0, expiry_s=1, connected=True).expired(10**9, 1)


def test_a_will_record_round_trips_and_its_end_drops_it():
    props = {"will_delay_interval": 5, "content_type": "text/plain", "correlation_data": b"\x00\x01",
             "user_property": [("k", "v"), ("k", "w")], "payload_format_indicator": 1}
    t = SessionTable()
    t.apply(10, encode(_saved()))
    t.apply(5, encode_will(SavedWill("c1", "alice", "10.0.0.7", "status/c1", b"\xffgone", 1, True, props, 5)))
    w = t.wills["c1"]
    assert (w.user, w.host, w.topic, w.payload, w.qos, w.retain, w.properties, w.delay_s, w.position) == (
        "alice", "10.0.0.7", "status/c1", b"\xffgone", 1, True, props, 5, 5)
    assert t.floor() == 5  # retention keeps a pending will's record
    t.apply(20, encode_will_end("c1"))
    assert t.wills == {} and t.floor() == 10


def test_the_offline_sessions_past_a_bound_are_the_longest_offline_and_leave_once_back_or_ended():
    t = SessionTable()
    for i, at in enumerate([50, 10, 40, 20, 30]):
        t.apply(i, encode(_saved("c%d" % i, at_ms=at)))
    t.apply(9, encode(_saved("on", at_ms=1, connected=True)))  # connected: never counted offline
    assert t.offline_count() == 5 and [s.client_id for s in t.offline()] == ["c1", "c3", "c4", "c2", "c0"]
    assert t.offline_past(5) == [] and t.offline_past(3) == ["c1", "c3"] and t.offline_past(3) == ["c1", "c3"]
    t.apply(10, encode(_saved("c1", at_ms=60, connected=True)))  # back online
    t.apply(11, encode_end("c3"))  # ended
    assert t.offline_count() == 3 and t.offline_past(1) == ["c4", "c2"]
    t.apply(12, encode(_saved("c1", at_ms=70)))  # offline again: now the newest
    assert t.offline_past(0) == ["c4", "c2", "c0", "c1"] and t.offline_past(-5) == ["c4", "c2", "c0", "c1"]


def test_many_sessions_going_offline_and_back_keep_the_bound_exact():
    t = SessionTable()
    for i in range(3000):
        t.apply(i, encode(_saved("c%d" % (i % 500), at_ms=i, connected=bool(i % 3))))
    offline = sorted((s for s in t.sessions.values() if not s.connected), key=lambda s: s.at_ms)
    assert t.offline_count() == len(offline)
    assert t.offline_past(100) == [s.client_id for s in offline[:len(offline) - 100]]


def test_a_start_counts_every_session_offline_but_the_connected_ids_named():
    t = SessionTable()
    t.apply(1, encode(_saved("a", at_ms=5, connected=True)))
    t.apply(2, encode(_saved("b", at_ms=3, connected=True)))
    t.apply(3, encode(_saved("c", at_ms=4)))
    t.connections_ended(live={"b"})
    assert [s.client_id for s in t.offline()] == ["c", "a"] and t.offline_past(1) == ["c"]
    assert t.sessions["b"].connected and not t.sessions["a"].connected
