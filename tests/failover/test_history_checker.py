"""The history checker (tests/harness/history.py) on hand-built histories: a clean run of each mode passes, each
kind of violation is caught and named (msg_id, position, brokers, time), duplicates are reported apart, a history
survives JSON, and malformed input is refused with a clear error. Unit tier: no network, no process."""

import json
import threading

import pytest

from tests.harness.history import (ACK_SLACK_S, History, check, check_branches, logs_from_json, logs_to_json)

T = "t-hist"


def pos(offset, partition=0):
    return (T, partition, offset)


def failover_run(lost_tail=0, lag=0, undelivered=()):
    """m acks a0..a4 at offsets 0..4 and is killed (lag read at 10.0, fault at 10.1); s, promoted, acks b0..b2.
    ``lost_tail`` of m's last acks never reached s (s's b messages take their offsets). Returns (history, logs)."""
    h = History()
    kept = 5 - lost_tail
    for i in range(5):
        h.ack("p1", T, 0, i, "a%d" % i, 1.0 + i)
    for i in range(5):
        h.deliver("c1", T, 0, i, "a%d" % i, 1.5 + i)
    h.fault("kill_master", 10.1, lag_messages=lag, lag_t=10.0, target="m")
    for i in range(3):
        h.ack("p1", T, 0, kept + i, "b%d" % i, 12.0 + i)
        if "b%d" % i not in undelivered:
            h.deliver("c1", T, 0, kept + i, "b%d" % i, 12.5 + i)
    h.heal(20.0)
    final = {pos(i): "a%d" % i for i in range(kept)}
    final.update({pos(kept + i): "b%d" % i for i in range(3)})
    return h, {"m": dict(final), "s": dict(final)}


def test_a_clean_sync_failover_passes():
    h, logs = failover_run()
    verdict = check(h, logs, "sync", master="s")
    assert verdict == [], verdict.summary()
    assert verdict.duplicates == [] and verdict.lost == {}
    assert verdict.counts["acked msg_ids"] == 8 and verdict.counts["deliveries"] == 8
    assert "fault #1 kill_master of m t+9.100s" in verdict.summary()


def test_a_clean_async_failover_with_losses_within_the_lag_passes():
    h, logs = failover_run(lost_tail=2, lag=2)
    verdict = check(h, logs, "async", master="s")
    assert verdict == [], verdict.summary()
    assert sorted(verdict.lost) == ["a3", "a4"]
    assert "2 lost, bound 2 (lag 2 read at t+9.000s + 0 acknowledged after it)" in verdict.summary()


def test_a_single_broker_needs_no_master_name_and_two_do():
    h, logs = failover_run()
    assert check(h, {"s": logs["s"]}, "sync") == []
    with pytest.raises(ValueError, match="give master= .*: logs hold m, s"):
        check(h, logs, "sync")
    with pytest.raises(ValueError, match="master 'x' is not in logs"):
        check(h, logs, "sync", master="x")


# -- (a) sync: nothing acknowledged lost, nothing acknowledged moved ---------------------------------------------

def test_sync_an_acknowledged_message_missing_from_the_final_master_is_lost():
    h, logs = failover_run(lost_tail=1, lag=1)
    logs["m"] = {pos(i): "a%d" % i for i in range(5)}  # the old master, not rejoined yet, still holds a4
    verdict = check(h, logs, "sync", master="s")
    lost = [v for v in verdict if v.startswith("LOST")]
    assert lost == ["LOST (sync) a4: acknowledged to p1 at t-hist-0@4 t+4.000s; s holds b0 there; "
                    "on the brokers: m at t-hist-0@4; s nowhere"], verdict.summary()
    assert verdict.lost["a4"].offset == 4


def test_sync_a_message_acknowledged_at_a_position_that_now_holds_another_is_overwritten():
    h = History()
    h.ack("p1", T, 0, 0, "x", 1.0)
    h.ack("p2", T, 0, 0, "y", 2.0)  # two acks claim offset 0: one of them is not there
    h.deliver("c", T, 0, 0, "y", 3.0)
    h.deliver("c", T, 0, 1, "x", 3.0)
    logs = {"s": {pos(0): "y", pos(1): "x"}}
    verdict = check(h, logs, "sync")
    assert verdict == ["OVERWRITTEN (sync) x: acknowledged to p1 at t-hist-0@0 t+0.000s, but s holds y there "
                       "(acknowledged to p2 at t-hist-0@0 t+1.000s); s holds it at t-hist-0@1"], verdict.summary()
    assert check(h, logs, "async") == []  # async promises no position


# -- (b) divergent logs --------------------------------------------------------------------------------------------

def test_two_brokers_holding_different_messages_at_one_position_diverge():
    h, logs = failover_run()
    logs["m"][pos(5)] = "a-extra"  # the old master kept a tail where the new master wrote b0
    h.fail("p1", "a-extra", 9.9, "FLUSH_SLAVE_TIMEOUT")
    verdict = check(h, logs, "sync", master="s")
    assert verdict == ["DIVERGENT at t-hist-0@5: m holds a-extra (never acknowledged); s holds b0 "
                       "(acknowledged to p1 at t-hist-0@5 t+11.000s)"], verdict.summary()


def test_divergence_on_three_brokers_names_each():
    h = History()
    h.ack("p", T, 1, 0, "x", 0.0)
    h.deliver("c", T, 1, 0, "x", 0.5)
    verdict = check(h, {"a": {pos(0, 1): "x"}, "b": {pos(0, 1): "x"}, "c": {pos(0, 1): "z"}}, "async", master="a")
    assert [v for v in verdict if v.startswith("DIVERGENT")] == [
        "DIVERGENT at t-hist-1@0: a and b hold x (acknowledged to p at t-hist-1@0 t+0.000s); "
        "c holds z (never acknowledged)"]


# -- (c) every acknowledged message delivered; nothing delivered that nobody sent --------------------------------

def test_an_acknowledged_message_never_delivered_is_reported():
    h, logs = failover_run(undelivered=("b1",))
    verdict = check(h, logs, "sync", master="s")
    assert verdict == ["UNDELIVERED b1: acknowledged to p1 at t-hist-0@6 t+12.000s; s holds it at t-hist-0@6; "
                       "the group got 7 deliveries of 7 msg_ids, the last at t+13.500s"], verdict.summary()


def test_a_lost_async_message_is_not_also_reported_undelivered():
    h, logs = failover_run(lost_tail=1, lag=1)
    verdict = check(h, logs, "async", master="s")
    assert not any(v.startswith("UNDELIVERED") for v in verdict)


def test_phantoms_in_deliveries_and_logs_are_reported():
    h, logs = failover_run()
    h.deliver("c2", T, 0, 9, "ghost", 15.0)
    logs["m"][pos(9)] = "ghost"
    logs["m"][("other-topic", 0, 0)] = "not ours"  # topics the history never used are not judged
    verdict = check(h, logs, "sync", master="s")
    assert verdict == ["PHANTOM delivery ghost to c2 from t-hist-0@9 t+14.000s: no producer sent it",
                       "PHANTOM in m's log: ghost at t-hist-0@9: no producer sent it"], verdict.summary()


# -- (d) async: losses bounded by the lag before each fault ------------------------------------------------------

def test_async_losses_over_the_lag_are_reported_with_each_lost_message():
    h, logs = failover_run(lost_tail=2, lag=1)
    verdict = check(h, logs, "async", master="s")
    assert len(verdict) == 1, verdict.summary()
    v = verdict[0]
    assert v.startswith("OVER BOUND (async) fault #1 kill_master of m at t+9.100s: 2 acknowledged msg_ids lost > "
                        "bound 1 (lag 1 read at t+9.000s + 0 acknowledged after the reading); lost: "), v
    assert "a3 acknowledged to p1 at t-hist-0@3 t+3.000s, s holds b0 there; m nowhere; s nowhere" in v
    assert "a4 acknowledged to p1 at t-hist-0@4 t+4.000s" in v


def test_messages_acknowledged_after_the_lag_reading_widen_the_bound():
    h = History()
    h.ack("p", T, 0, 0, "x0", 1.0)
    h.ack("p", T, 0, 1, "x1", 5.05)  # after the reading (5.0), before the kill (5.1)
    h.ack("p", T, 0, 2, "x2", 5.1 + ACK_SLACK_S / 2)  # a reply read just after the kill: still the old master's
    h.fault("kill_master", 5.1, lag_messages=0, lag_t=5.0, target="m")
    for i in range(3):
        h.deliver("c", T, 0, i, "x%d" % i, 5.0)
    logs = {"s": {pos(0): "x0"}}
    verdict = check(h, logs, "async")
    assert verdict == [] and sorted(verdict.lost) == ["x1", "x2"], verdict.summary()
    assert check(h, logs, "async", ack_slack=0.0) == [
        "LOST WITHOUT FAULT (async) x2: acknowledged to p at t-hist-0@2 t+4.200s, after the last fault; s's log of "
        "t-hist-0 ends at offset 1; on the brokers: s nowhere"]


def test_each_loss_counts_against_the_fault_whose_window_it_was_acknowledged_in():
    h = History()
    h.ack("p", T, 0, 0, "w1", 1.0)  # window of fault 1 (lag 1)
    h.fault("kill_master", 2.0, lag_messages=1, lag_t=2.0, target="m")
    h.ack("p", T, 0, 0, "w2a", 3.0)  # window of fault 2 (lag 0)
    h.ack("p", T, 0, 1, "w2b", 3.5)
    h.fault("kill_master", 4.0, lag_messages=0, lag_t=4.0, target="s")
    h.heal(6.0)
    logs = {"m": {pos(0): "z"}}
    h.ack("p", T, 0, 0, "z", 5.0)
    for m in ("w1", "w2a", "w2b", "z"):
        h.deliver("c", T, 0, 0, m, 5.5)
    verdict = check(h, logs, "async", master="m")
    assert len(verdict) == 1, verdict.summary()
    assert verdict[0].startswith("OVER BOUND (async) fault #2 kill_master of s at t+3.000s: 2 acknowledged msg_ids "
                                 "lost > bound 0 (lag 0 read at t+3.000s"), verdict[0]
    summary = verdict.summary()
    assert "fault #1 kill_master of m at t+1.000s: window start..t+1.200s, 1 lost, bound 1" in summary
    assert "fault #2 kill_master of s at t+3.000s: window t+1.200s..t+3.200s, 2 lost, bound 0" in summary


def test_a_window_never_reaches_past_the_next_faults_lag_reading():
    """Two faults 0.1 s apart (less than the slack): what was acknowledged after the second fault's lag reading
    counts against the second fault, not the first."""
    h = History()
    h.ack("p", T, 0, 0, "early", 1.0)
    h.fault("cut_link", 2.0, lag_messages=0, lag_t=2.0, target="s")
    h.ack("p", T, 0, 1, "between", 2.04)  # after the cut, before the kill's lag reading (2.05)
    for i in range(3):
        h.ack("p", T, 0, 2 + i, "late%d" % i, 2.06 + i / 100)  # after the kill's lag reading
    h.fault("kill_master", 2.1, lag_messages=1, lag_t=2.05, target="m")
    for m in ("early", "between", "late0", "late1", "late2"):
        h.deliver("c", T, 0, 0, m, 3.0)
    verdict = check(h, {"s": {pos(0): "early"}}, "async")
    assert verdict == [], verdict.summary()
    summary = verdict.summary()
    assert "fault #1 cut_link of s at t+1.000s: window start..t+1.050s, 1 lost, bound 1 (lag 0" in summary
    assert "fault #2 kill_master of m at t+1.100s: window t+1.050s..t+1.300s, 3 lost, bound 4 (lag 1" in summary


def test_a_fault_without_a_lag_reading_bounds_nothing():
    h = History()
    h.ack("p", T, 0, 0, "x", 1.0)
    h.deliver("c", T, 0, 0, "x", 1.1)
    h.fault("restart_zk", 2.0)
    verdict = check(h, {"s": {}}, "async")
    assert len(verdict) == 1 and "1 acknowledged msg_ids lost > bound 0 (lag not read at t+1.000s" in verdict[0]


# -- (e) duplicates: reported apart, never violations ------------------------------------------------------------

def test_a_message_acknowledged_at_two_positions_is_a_duplicate_not_a_violation():
    h = History()
    h.fail("p", "x", 1.0, "RequestTimeout: no reply")
    h.ack("p", T, 0, 1, "x", 2.0)  # the retry after the ambiguous failure: the first attempt was stored too
    h.ack("p", T, 1, 0, "y", 2.5)
    h.ack("p", T, 1, 1, "y", 2.6)  # acknowledged twice with no failure: reported so, still not a violation
    for part, off, m in ((0, 0, "x"), (0, 1, "x"), (1, 0, "y"), (1, 1, "y")):
        h.deliver("c", T, part, off, m, 3.0)
    logs = {"s": {pos(0): "x", pos(1): "x", pos(0, 1): "y", pos(1, 1): "y"}}
    verdict = check(h, logs, "sync")
    assert verdict == [], verdict.summary()
    assert verdict.duplicates == [
        "DUPLICATE ack y: acknowledged to p at t-hist-1@0 t+1.500s; acknowledged to p at t-hist-1@1 t+1.600s; "
        "no failed attempt recorded before it",
        "DUPLICATE in s's log x: at t-hist-0@0, t-hist-0@1 (acknowledged at t-hist-0@1)",
        "DUPLICATE in s's log y: at t-hist-1@0, t-hist-1@1 (acknowledged at t-hist-1@0, t-hist-1@1)"]
    h.ack("p", T, 0, 0, "x", 2.1)
    assert ("DUPLICATE ack x: acknowledged to p at t-hist-0@1 t+1.000s; acknowledged to p at t-hist-0@0 t+1.100s; "
            "after a failed attempt at t+0.000s (RequestTimeout: no reply)") in check(h, logs, "sync").duplicates
    assert "3 duplicate(s) (allowed):" in verdict.summary() and "0 violation(s)" in verdict.summary()


def test_a_summary_lists_at_most_the_limit():
    h = History()
    for i in range(30):
        h.ack("p", T, 0, i, "m%d" % i, float(i))
    verdict = check(h, {"s": {pos(i): "m%d" % i for i in range(30)}}, "sync")
    assert len(verdict) == 30
    assert "... and 25 more" in verdict.summary(limit=5)


# -- JSON ----------------------------------------------------------------------------------------------------------

def test_a_history_and_its_logs_survive_json(tmp_path):
    h, logs = failover_run(lost_tail=2, lag=1)
    h.fault("pause_master", 21.0, lag_messages=3, target="s", seconds=6, mode="sigstop")
    path = h.dump(str(tmp_path / "history.json"))
    back = History.load(path)
    assert back.events() == h.events()
    assert back.events()[-1].detail == {"seconds": 6, "mode": "sigstop"}
    logs_back = logs_from_json(logs_to_json(logs))
    assert logs_back == logs
    assert check(back, logs_back, "async", master="s") == check(h, logs, "async", master="s") != []


@pytest.mark.parametrize("text, match", [
    ("{", "history JSON: "),
    ('{"version": 2, "events": []}', "expected"),
    ('{"version": 1, "events": [{"event": "boom"}]}', "event #0 has no known"),
    ('{"version": 1, "events": [{"event": "heal"}]}', r"event #0 \(heal\) has fields \[\], expected \['t'\]"),
    ('{"version": 1, "events": [{"event": "heal", "t": 1}, {"event": "ack", "producer": "p", "topic": "t", '
     '"partition": 0, "offset": -3, "msg_id": "m", "t": 1}]}', r"event #1: ack: offset must be an int >= 0, got -3"),
    ('{"version": 1, "events": [{"event": "fault", "kind": "k", "t": 1, "lag_messages": null, "lag_t": 1, '
     '"target": null, "detail": {"t": 5}}]}', "detail must be an object whose keys are not"),
])
def test_malformed_history_json_is_refused(text, match):
    with pytest.raises(ValueError, match=match):
        History.from_json(text)


# -- bad input -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call, match", [
    (lambda h: h.ack("p", T, 0, -1, "m", 1.0), r"ack: offset must be an int >= 0, got -1"),
    (lambda h: h.ack("p", T, True, 0, "m", 1.0), r"ack: partition must be an int >= 0, got True"),
    (lambda h: h.ack("p", "", 0, 0, "m", 1.0), r"ack: topic must be a non-empty string"),
    (lambda h: h.ack("p", T, 0, 0, b"m", 1.0), r"ack: msg_id must be a non-empty string, got b'm'"),
    (lambda h: h.ack("p", T, 0, 0, "m", float("nan")), r"ack: t must be a finite number"),
    (lambda h: h.fail("p", "m", 1.0, ""), r"fail: reason must be a non-empty string"),
    (lambda h: h.deliver(None, T, 0, 0, "m", 1.0), r"deliver: consumer must be a non-empty string"),
    (lambda h: h.fault("kill", 1.0, lag_messages=-2), r"fault: lag_messages must be an int >= 0"),
    (lambda h: h.fault("kill", 1.0, lag_t=2.0), r"fault: lag_t 2.0 is after the fault's time 1.0"),
    (lambda h: h.fault("kill", 1.0, why=object()), r"fault: detail must be JSON values"),
    (lambda h: h.heal("soon"), r"heal: t must be a finite number"),
])
def test_bad_events_are_refused(call, match):
    h = History()
    with pytest.raises(ValueError, match=match):
        call(h)
    assert len(h) == 0


@pytest.mark.parametrize("logs, match", [
    ({}, "logs must be a non-empty"),
    ({"m": [("t", 0, 0)]}, r"logs\['m'\] must be a dict"),
    ({"m": {("t", 0): "x"}}, r"logs\['m'\]: key \('t', 0\) is not \(topic, partition, offset\)"),
    ({"m": {("t", 0, -1): "x"}}, r"logs\['m'\]: offset must be an int >= 0"),
    ({"m": {("t", 0, 0): ""}}, r"logs\['m'\]\[t-0@0\]: msg_id must be a non-empty string"),
])
def test_malformed_logs_are_refused(logs, match):
    with pytest.raises(ValueError, match=match):
        check(History(), logs, "sync")


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode must be one of sync/async, got 'semi'"):
        check(History(), {"m": {}}, "semi")


def test_logs_json_that_is_not_the_shape_is_refused():
    with pytest.raises(ValueError, match="logs JSON: expected"):
        logs_from_json(json.dumps({"m": [["t", 0]]}))


def test_a_history_is_bounded_and_thread_safe():
    h = History(max_events=4000)
    threads = [threading.Thread(target=lambda n=n: [h.ack("p%d" % n, T, 0, i, "m%d-%d" % (n, i), 0.0)
                                                    for i in range(1000)]) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(h) == 4000 and len(h.acked_ids()) == 4000
    with pytest.raises(OverflowError, match="history full: 4000 events"):
        h.heal(1.0)


# -- XA branches (check_branches) --------------------------------------------------------------------------------

def test_branches_prepared_and_committed_as_answered_pass():
    assert check_branches({"a", "b", "c"}, {"a"}, {"b", "c"}, {"a": 1}, "sync") == []


def test_each_kind_of_branch_violation_is_named():
    got = check_branches({"lost", "twice", "back", "uncommitted", "gone"}, {"twice", "back", "gone"},
                         {"back", "stranger"}, {"twice": 2, "back": 1, "uncommitted": 1}, "sync")
    assert got == ["BRANCH RESURFACED back: RECOVER lists it while its message is stored",
                   "COMMIT LOST (sync) gone: the commit was answered OK; its message is not stored",
                   "BRANCH LOST lost: answered XA_OK, never decided, not listed by RECOVER",
                   "STORED TWICE twice: its message is stored 2 times",
                   "STORED UNCOMMITTED uncommitted: never committed, its message is stored",
                   "UNKNOWN BRANCH stranger: RECOVER lists a branch never prepared"]


def test_async_lets_a_commit_lost_in_the_lag_leave_its_branch_prepared_again_and_sync_does_not():
    assert check_branches({"a"}, {"a"}, {"a"}, {}, "async") == []
    assert check_branches({"a"}, {"a"}, {"a"}, {}, "sync") == [
        "COMMIT LOST (sync) a: the commit was answered OK; its message is not stored (RECOVER lists it prepared "
        "again)"]
    assert check_branches({"a"}, {"a"}, set(), {}, "async") == [
        "COMMIT LOST (async) a: the commit was answered OK; its message is not stored"]


def test_bad_branch_input_is_refused():
    with pytest.raises(ValueError, match="committed but never prepared: x"):
        check_branches(set(), {"x"}, set(), {}, "sync")
    with pytest.raises(ValueError, match="mode must be one of"):
        check_branches(set(), set(), set(), {}, "quorum")
