"""What follows a burst's append, each step one Python definition (compiled where built, ``metaq.native``), against
the rule it keeps, seeded: the async flush policy of ``MessageStore.should_flush``, the wake of
``BrokerWrites.visible`` and ``PartitionWaiters.notify``, state included."""

import random
from types import SimpleNamespace

import pytest

from metaq.serving.longpoll import NEW_PARTITION, PartitionWaiters
from metaq.serving.putpath import ACK_NOW, BrokerWrites
from metaq.store.positions import LogPositions
from metaq.store.store import MessageStore


def _store(rnd):
    """A ``MessageStore`` of the fields ``should_flush`` reads, made without opening a log: where the store is
    compiled its method takes a store and its positions as they are declared, nothing standing in for them."""
    written = rnd.randrange(0, 1000)
    pos = LogPositions(async_visible=True)
    pos.written, pos.flushed = written, rnd.choice((written, rnd.randrange(0, 1000)))
    pos.unflushed_msgs = rnd.randrange(0, 20)
    store = MessageStore.__new__(MessageStore)
    store._pos, store._async, store._last_flush_ms = pos, rnd.random() < 0.8, rnd.randrange(0, 1000)
    store.config = SimpleNamespace(flush_every_messages=rnd.randrange(1, 20), flush_interval_ms=rnd.randrange(1, 300))
    return store


@pytest.mark.parametrize("seed", range(8))
def test_should_flush_answers_and_moves_the_last_flush_by_the_policy(seed):
    """Nothing written past the flushed end: no, and the interval starts again now. ``sync``: yes whenever
    something is. ``async``: yes once ``flush_every_messages`` are unflushed or ``flush_interval_ms`` passed since
    the last yes, which starts the interval again; otherwise no, the interval running on."""
    rnd = random.Random(seed)
    for _ in range(500):
        store = _store(rnd)
        pos, cfg, last = store._pos, store.config, store._last_flush_ms
        now = rnd.randrange(0, 1500)
        behind = pos.written > pos.flushed
        due = (pos.unflushed_msgs >= cfg.flush_every_messages or now - last >= cfg.flush_interval_ms)
        want = behind and (not store._async or due)
        assert store.should_flush(now) is want
        assert store._last_flush_ms == (now if not behind or (store._async and due) else last)


class _Store(MessageStore):
    """A ``MessageStore`` (the type ``BrokerWrites`` declares) whose flush policy answers at random, recorded."""

    def __init__(self, rnd, calls):
        self.rnd, self.calls = rnd, calls

    def should_flush(self, now):
        self.calls.append(("should_flush", now))
        return self.rnd.random() < 0.5


class _Waiters(PartitionWaiters):
    """A ``PartitionWaiters`` (the type ``BrokerWrites`` declares) whose wake is recorded."""

    def __init__(self, calls):
        super().__init__()
        self.calls = calls

    def notify(self, keys, quiet=None, settle=False):
        self.calls.append(("notify", keys, quiet, settle))
        return False


def _writes(rnd, calls, fail):
    def wake():
        calls.append(("wake",))

    def deliver(*args):
        calls.append(("deliver", args))
        if fail:
            raise OSError("the delivery failed")
        return {"k": {"ev"}}

    writes = BrokerWrites(_Store(rnd, calls), _Waiters(calls), SimpleNamespace(wake=wake))
    return writes, deliver


@pytest.mark.parametrize("seed", range(8))
def test_visible_delivers_then_wakes_then_asks_the_flush_policy(seed):
    """``deliver(*args)`` first (its answer the quiet waits), the waiters woken with ``settle``, the flusher woken
    when the policy says so; ACK_NOW. A delivery that fails raises before anyone is woken."""
    rnd = random.Random(seed)
    for _ in range(200):
        shape, fail, answers = rnd.randrange(4), rnd.random() < 0.1, rnd.randrange(1 << 30)
        calls = []
        writes, deliver = _writes(random.Random(answers), calls, fail)
        tail = ((), ({"q": set()},), (None, deliver), (None, deliver, ("a", 1)))[shape]
        keys = (("t", 0),)
        if fail and shape >= 2:
            with pytest.raises(OSError, match="the delivery failed"):
                writes.visible(keys, 5, *tail)
            assert calls == [("deliver", tail[2] if shape == 3 else ())]
            continue
        assert writes.visible(keys, 5, *tail) == ACK_NOW
        due = random.Random(answers).random() < 0.5
        want = [("deliver", tail[2] if shape == 3 else ())] if shape >= 2 else []
        quiet = {"k": {"ev"}} if shape >= 2 else (tail[0] if tail else None)
        want += [("notify", keys, quiet, True), ("should_flush", 5)] + ([("wake",)] if due else [])
        assert calls == want


class _Ev:
    """An Event stand-in that records its wake."""

    def __init__(self, name, woken):
        self.name, self.woken = name, woken

    def set(self):
        self.woken.append(self.name)

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        return self.name == other.name

    def __repr__(self):
        return self.name


def _waiters(rnd, woken):
    w = PartitionWaiters()
    keys = [("t", p) for p in range(4)] + [NEW_PARTITION]
    for key in rnd.sample(keys, rnd.randrange(len(keys) + 1)):
        w._waits[key] = {_Ev("%s%d-%d" % (key[0], key[1], k), woken) for k in range(rnd.randrange(1, 4))}
    w._made = rnd.random() < 0.3
    return w, keys


@pytest.mark.parametrize("seed", range(8))
def test_notify_wakes_all_but_the_quiet_and_keeps_only_those_waiting(seed, monkeypatch):
    """Waits of each key, the quiet ones a delivery served (all of a key's, some, none, an empty set), a partition
    made since the last wake: every wait of a named key (and of ``NEW_PARTITION`` once one was made) is woken but
    the quiet ones, which alone stay in the map (a key with none left leaves it); ``settle`` yields once, only when
    one was woken."""
    import gevent

    rnd = random.Random(seed)
    for _ in range(300):
        woken, slept = [], []
        w, keys = _waiters(rnd, woken)
        named = rnd.sample(keys[:4], rnd.randrange(5))
        quiet = None
        if rnd.random() < 0.6:
            quiet = {}
            for key in named:
                held = sorted(w._waits.get(key, ()), key=repr)
                quiet[key] = set(rnd.sample(held, rnd.randrange(len(held) + 1))) if held else set()
        settle = rnd.random() < 0.5
        before, made = {k: set(v) for k, v in w._waits.items()}, w._made
        want_woken, want_left = set(), {k: v for k, v in before.items()}
        for key in named + ([NEW_PARTITION] if made and before else []):
            if key not in before:
                continue
            stay = (quiet or {}).get(key) or set()
            want_woken |= before[key] - stay
            if before[key] & stay:
                want_left[key] = before[key] & stay
            else:
                del want_left[key]
        monkeypatch.setattr(gevent, "sleep", slept.append)
        out = w.notify(tuple(named), quiet, settle)
        assert out is bool(want_woken)
        assert sorted(woken) == sorted(repr(e) for e in want_woken) and len(woken) == len(want_woken)
        assert slept == ([0] if want_woken and settle else [])
        assert {k: set(v) for k, v in w._waits.items()} == want_left
        assert w._made is (made and not before)


def test_visible_of_writes_made_without_waiters_raises_a_clear_error_and_wakes_nothing():
    """A journal's writes alone (a slave's ``BrokerWrites(store)``) have no readers to wake: ``visible`` there is a
    programming error, raised as a TypeError (compiled, a typed None would otherwise crash the process)."""
    calls = []
    writes = BrokerWrites(_Store(random.Random(0), calls))
    with pytest.raises(TypeError, match="without waiters"):
        writes.visible({("t", 0)}, 0)
    assert calls == []
