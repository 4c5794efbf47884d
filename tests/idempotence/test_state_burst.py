"""Idempotent puts taken as a burst (``put_idempotent_run`` / ``put_idempotent_prepared``, the broker's fast path):
the same log, index units, producers' window and answers as one ``put_idempotent`` at a time."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq.errors import MetaqError
from metaq.idempotence.wire import IdempotentPut
from metaq.protocol.checksum import metaq_checksum
from metaq.idempotence.burst import scan_idem_burst_py
from metaq.protocol.message import encode_payload
from metaq.protocol.text import serialize
from tests.harness.store import NOW, files_of, open_store

KEYS = [(11, "test", 0), (11, "test", 1), (12, "test", 0), (11, "tb", 1)]


@st.composite
def idempotent_sends(draw):
    """What producers send: mostly the next sequence of one of a few producer-partitions, sometimes a resend
    (the same message, or another one: refused), a sequence that skips ahead, a partition that does not exist."""
    sent = {}  # (pid, topic, partition) -> {seq: (body, attribute)}
    out = []
    for _ in range(draw(st.integers(1, 80))):
        key = draw(st.sampled_from(KEYS))
        seqs = sent.setdefault(key, {})
        kind = draw(st.sampled_from(["next"] * 8 + ["resend", "other", "skip", "bad partition"]))
        body, attribute = draw(st.binary(max_size=300)), draw(st.one_of(st.none(), st.text(max_size=12)))
        if kind in ("resend", "other") and seqs:
            seq = draw(st.sampled_from(sorted(seqs)))
            if kind == "resend":
                body, attribute = seqs[seq]
        else:
            seq = max(seqs, default=-1) + (draw(st.integers(2, 4)) if kind == "skip" else 1)
            seqs[seq] = (body, attribute)
        pid, topic, partition = key
        out.append((pid, topic, 7 if kind == "bad partition" else partition, seq, body, attribute))
    return out


def one_at_a_time(store, sends, now):
    """The general path: ``put_idempotent`` per send; ``[(msg_id, partition, offset, duplicate) or error type]``."""
    out = []
    for pid, topic, partition, seq, body, attribute in sends:
        flag, data = encode_payload(body, attribute)
        try:
            r, _pos, dup = store.put_idempotent(topic, partition, flag, data, now, pid, seq)
        except MetaqError as exc:
            out.append(type(exc))
            continue
        out.append((r.msg_id, r.partition, r.offset, dup))
    return out


def as_burst(store, sends, now):
    """What the broker's burst path does (idempotence/fasttext.py), at the store's level."""
    parts = []
    for i, (pid, topic, partition, seq, body, attribute) in enumerate(sends):
        flag, data = encode_payload(body, attribute)
        parts.append(serialize(IdempotentPut(topic, partition, flag, data, i, metaq_checksum(data), pid, seq)))
    buf = b"".join(parts)
    frames, data, stop = scan_idem_burst_py(buf, 0, len(buf), 1 << 20, 1024)
    assert stop == len(buf)
    out, i = [], 0
    while i < len(frames):
        j = i + 1
        while (j < len(frames) and frames[j][:2] == frames[i][:2] and frames[j][8] == frames[i][8]
               and frames[j][9] == frames[i][9] + j - i):
            j += 1
        taken, runs = store.put_idempotent_run(frames[i:j], data, now)
        for run in runs:
            out.extend((run.first_id + k, run.key[1], run.first_offset + k, False) for k in range(run.count))
        i += taken
        if taken:
            continue
        f = frames[i]
        i += 1
        try:
            r, _pos, dup = store.put_idempotent_prepared(f[0].decode(), f[1], f[2], data[f[4]:f[4] + f[5]], now,
                                                         f[8], f[9], f[6] & 0x7FFFFFFF)
        except MetaqError as exc:
            out.append(type(exc))
            continue
        out.append((r.msg_id, r.partition, r.offset, dup))
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(idempotent_sends(), st.integers(1, 3))
def test_a_burst_stores_and_answers_as_one_put_at_a_time(tmp_path_factory, writer, sends, split):
    base = tmp_path_factory.mktemp("idem")
    one, many = open_store(base / "one"), open_store(base / "many")
    cut = len(sends) // split  # the sends arrive in one or more bursts
    expected = one_at_a_time(one, sends[:cut], NOW) + one_at_a_time(one, sends[cut:], NOW + 1)
    got = as_burst(many, sends[:cut], NOW) + as_burst(many, sends[cut:], NOW + 1)
    assert got == expected
    assert many.idempotence.table.contents() == one.idempotence.table.contents()
    assert [v for k, v in many.idempotence.summary_values()] == [v for k, v in one.idempotence.summary_values()]
    for s in (one, many):
        s.close(NOW + 2)
    assert files_of(base / "many") == files_of(base / "one")  # segments, index units (tags), producers snapshot


def test_a_run_is_taken_in_one_step_and_a_resend_alone(tmp_path):
    s = open_store(tmp_path / "d", segment_size=1 << 20, index_file_units=4096)
    s.put_idempotent("test", 0, 0, b"first", NOW, 5, 0)  # the partition's first put goes the general way
    sends = [(5, "test", 0, seq, b"m%d" % seq, None) for seq in range(1, 200)] + [(5, "test", 0, 3, b"m3", None)]
    got = as_burst(s, sends, NOW)
    assert [g[2:] for g in got] == [(seq, False) for seq in range(1, 200)] + [(3, True)]
    assert s.idempotence.puts == 200 and s.idempotence.duplicates == 1
    assert s.idempotence.table.contents() == [((5, "test", 0), 199, NOW, [0, 0, 200], None)]
    s.close(NOW)
