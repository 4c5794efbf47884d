/* append_run: one run of a burst appended with its bookkeeping in one call (metaq/store/batch.py).
 *
 *   append_run(runs, run_type, log, seg_start, rel, ready, src, frames, i, j, room, topic, partition, p, off,
 *              now_ms, ids, positions, index, unit_at, overhead) == metaq.store.batch.append_run_py
 *
 * The ids are taken as IdGenerator.take takes them (min(j - i, room) at most, those the run did not use given back
 * as give_back does), the records written as write_run writes them, the positions advanced as LogPositions.advance
 * advances them, and the run's BurstRun appended to ``runs``; returns how many records were written. The objects'
 * own fields are read and set here exactly as those methods do (the tests hold the twins equal, state included), so
 * a burst's run costs the put path one call instead of four.
 *
 *   now_ms() == metaq.server.clock.now_ms_py: the broker's wall clock, the stamp a burst is written with.
 *
 *   burst_append(writer, run_type, fixed_overhead, unit_size, frames, src, now_ms) == BurstWriter.append (below).
 */
#define PY_SSIZE_T_CLEAN
#include "_speedups.h"
#include <time.h>

/* metaq/protocol/msgid.py's layout. */
#define TWEPOCH 1303895660503LL
#define SEQUENCE_MASK 4095LL
#define TIMESTAMP_SHIFT 22

static PyObject *s_ts, *s_seq, *s_bits, *s_written, *s_max, *s_dirty, *s_visible, *s_async_visible, *s_pending,
    *s_log_bytes, *s_unflushed, *s_appended, *s_key, *s_append;

static int interned(void) {
    if (s_append != NULL)
        return 1;
#define INTERN(var, name)                                                                                             \
    if ((var = PyUnicode_InternFromString(name)) == NULL)                                                              \
        return 0;
    INTERN(s_ts, "_ts")
    INTERN(s_seq, "_seq")
    INTERN(s_bits, "_bits")
    INTERN(s_written, "written")
    INTERN(s_max, "max")
    INTERN(s_dirty, "dirty")
    INTERN(s_visible, "visible")
    INTERN(s_async_visible, "async_visible")
    INTERN(s_pending, "pending")
    INTERN(s_log_bytes, "log_bytes")
    INTERN(s_unflushed, "unflushed_msgs")
    INTERN(s_appended, "appended")
    INTERN(s_key, "key")
    INTERN(s_append, "append")
#undef INTERN
    return 1;
}

/* obj.name as a long long; 0 with an exception set. */
static int get_ll(PyObject *obj, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return 0;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return !(*out == -1 && PyErr_Occurred());
}

/* obj.name = value; 0 with an exception set. */
static int set_ll(PyObject *obj, PyObject *name, long long value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL)
        return 0;
    int rc = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return rc == 0;
}

/* obj.name += add; 0 with an exception set. */
static int add_ll(PyObject *obj, PyObject *name, long long add) {
    long long v;
    return get_ll(obj, name, &v) && set_ll(obj, name, v + add);
}

PyObject *append_run(PyObject *self, PyObject *args) {
    PyObject *runs, *run_type, *log_obj, *src_obj, *frames, *topic_obj, *p, *ids, *positions, *index_obj;
    long long seg_start, off, now_ms;
    Py_ssize_t rel, ready, i, j, room, unit_at, overhead;
    long partition;
    if (!PyArg_ParseTuple(args, "O!OOLnnOOnnnSlOLLOOOnn", &PyList_Type, &runs, &run_type, &log_obj, &seg_start, &rel,
                          &ready, &src_obj, &frames, &i, &j, &room, &topic_obj, &partition, &p, &off, &now_ms, &ids,
                          &positions, &index_obj, &unit_at, &overhead))
        return NULL;
    if (!interned())
        return NULL;
    if (!PyType_Check(run_type) || !PyType_IsSubtype((PyTypeObject *)run_type, &PyTuple_Type))
        return PyErr_Format(PyExc_TypeError, "run_type must be a tuple type");
    /* IdGenerator.take(now_ms, min(j - i, room)) */
    long long want = j - i < room ? j - i : room, ts = now_ms - TWEPOCH, seq = 0, cur, bits;
    PyObject *ts_obj = PyObject_GetAttr(ids, s_ts);
    if (ts_obj == NULL)
        return NULL;
    if (ts_obj != Py_None) {
        cur = PyLong_AsLongLong(ts_obj);
        if (cur == -1 && PyErr_Occurred()) {
            Py_DECREF(ts_obj);
            return NULL;
        }
        if (ts <= cur) {
            if (!get_ll(ids, s_seq, &seq)) {
                Py_DECREF(ts_obj);
                return NULL;
            }
            seq += 1;
            if (seq > SEQUENCE_MASK) {
                ts = cur + 1;
                seq = 0;
            } else {
                ts = cur;
            }
        }
    }
    Py_DECREF(ts_obj);
    if (!get_ll(ids, s_bits, &bits))
        return NULL;
    long long n = SEQUENCE_MASK - seq + 1;
    if (want < n)
        n = want;
    long long first_id = (ts << TIMESTAMP_SHIFT) | bits | seq;
    /* write_run */
    Py_buffer lb, sb, ib;
    if (!metaq_run_buffers(log_obj, src_obj, index_obj, &lb, &sb, &ib))
        return NULL;
    Py_ssize_t rel_after = rel;
    Py_ssize_t count = metaq_write_records(&lb, &sb, &ib, frames, i, i + (Py_ssize_t)n, topic_obj, partition,
                                           seg_start, &rel_after, ready, off, now_ms, first_id, unit_at);
    PyBuffer_Release(&ib);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&lb);
    if (count < 0)
        return NULL;
    /* what take and give_back leave: the last id used (the one before the first when none was) */
    if (!set_ll(ids, s_ts, ts) || !set_ll(ids, s_seq, seq + count - 1))
        return NULL;
    /* LogPositions.advance(p, off, seg_start + rel_after, nbytes, count) */
    long long nbytes = rel_after - rel, end = seg_start + rel_after, vis = off + count;
    if (!set_ll(positions, s_written, end) || !set_ll(p, s_max, vis) || PyObject_SetAttr(p, s_dirty, Py_True) < 0)
        return NULL;
    PyObject *async_visible = PyObject_GetAttr(positions, s_async_visible);
    if (async_visible == NULL)
        return NULL;
    int is_async = PyObject_IsTrue(async_visible);
    Py_DECREF(async_visible);
    if (is_async < 0)
        return NULL;
    if (is_async) {
        if (!set_ll(p, s_visible, vis))
            return NULL;
    } else {
        PyObject *pending = PyObject_GetAttr(positions, s_pending);
        if (pending == NULL)
            return NULL;
        PyObject *entry = Py_BuildValue("(LOL)", end, p, vis);
        PyObject *r = entry == NULL ? NULL : PyObject_CallMethodOneArg(pending, s_append, entry);
        Py_XDECREF(entry);
        Py_DECREF(pending);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    PyObject *log_bytes = PyObject_GetAttr(p, s_log_bytes);
    if (log_bytes == NULL)
        return NULL;
    int has_bytes = log_bytes != Py_None;
    Py_DECREF(log_bytes);
    if (has_bytes && !add_ll(p, s_log_bytes, nbytes))
        return NULL;
    if (!add_ll(positions, s_unflushed, count) || !add_ll(positions, s_appended, count))
        return NULL;
    /* the run's BurstRun: (key, count, body bytes, first id, first offset, first frame, log end) */
    PyObject *key = PyObject_GetAttr(p, s_key);
    if (key == NULL)
        return NULL;
    PyObject *fields = Py_BuildValue("((NnLLLnL))", key, count, nbytes - (long long)count * overhead, first_id, off,
                                     i, end);
    if (fields == NULL)
        return NULL;
    PyObject *run = PyTuple_Type.tp_new((PyTypeObject *)run_type, fields, NULL);
    Py_DECREF(fields);
    if (run == NULL)
        return NULL;
    int rc = PyList_Append(runs, run);
    Py_DECREF(run);
    return rc < 0 ? NULL : PyLong_FromSsize_t(count);
}

/* now_ms() == metaq.server.clock.now_ms_py: milliseconds since the Unix epoch (CLOCK_REALTIME, what time.time
   reads), an int; the stamp of every burst, read once a turn. */
PyObject *now_ms(PyObject *self, PyObject *unused) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

/* burst_append(writer, run_type, fixed_overhead, unit_size, frames, src, now_ms) == metaq.store.batch.BurstWriter
 * .append(writer, frames, src, now_ms) (``run_type``: BurstRun; ``fixed_overhead``: record.FIXED_OVERHEAD;
 * ``unit_size``: index.UNIT_SIZE): the burst writer's loop over its runs, each run through append_run, the writer's,
 * its active segment's, the partitions' and their tails' fields read (and ``advance_ready`` called) as the method
 * does. The store binds it as its ``put_burst``. */
static PyObject *s_log, *s_active, *s_refusal, *s_writer, *s_ids, *s_positions, *s_view, *s_start, *s_size,
    *s_ready, *s_advance_ready, *s_fast_end, *s_tail, *s_mm;

static int interned_burst(void) {
    if (s_mm != NULL)
        return 1;
#define INTERN(var, name)                                                                                             \
    if ((var = PyUnicode_InternFromString(name)) == NULL)                                                              \
        return 0;
    INTERN(s_log, "log")
    INTERN(s_active, "active")
    INTERN(s_refusal, "refusal")
    INTERN(s_writer, "writer")
    INTERN(s_ids, "ids")
    INTERN(s_positions, "positions")
    INTERN(s_view, "view")
    INTERN(s_start, "start")
    INTERN(s_size, "size")
    INTERN(s_ready, "ready")
    INTERN(s_advance_ready, "advance_ready")
    INTERN(s_fast_end, "fast_end")
    INTERN(s_tail, "tail")
    INTERN(s_mm, "mm")
#undef INTERN
    return 1;
}

/* frames[k][field] as a borrowed reference (frames a list of tuples, as burst_frames makes them); NULL with an
   exception set. */
static PyObject *frame_field(PyObject *frames, Py_ssize_t k, Py_ssize_t field) {
    PyObject *frame = PyList_GET_ITEM(frames, k);
    if (!PyTuple_Check(frame) || PyTuple_GET_SIZE(frame) <= field) {
        PyErr_SetString(PyExc_TypeError, "a burst frame must be a tuple of at least 7 fields");
        return NULL;
    }
    return PyTuple_GET_ITEM(frame, field);
}

PyObject *burst_append(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7)
        return PyErr_Format(PyExc_TypeError, "burst_append takes 7 arguments (%zd given)", nargs);
    if (!interned() || !interned_burst())
        return NULL;
    PyObject *bw = args[0], *run_type = args[1], *frames = args[4], *src = args[5], *now = args[6];
    Py_ssize_t fixed = PyLong_AsSsize_t(args[2]), unit_size = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (!PyList_Check(frames))
        return PyErr_Format(PyExc_TypeError, "the burst's frames must be a list");
    PyObject *runs = PyList_New(0), *log = NULL, *seg = NULL, *refusal = NULL, *writer = NULL, *ids = NULL,
             *positions = NULL, *view = NULL, *result = NULL;
    if (runs == NULL)
        return NULL;
    Py_ssize_t i = 0, n = PyList_GET_SIZE(frames);
    if ((log = PyObject_GetAttr(bw, s_log)) == NULL || (seg = PyObject_GetAttr(log, s_active)) == NULL ||
        (refusal = PyObject_GetAttr(bw, s_refusal)) == NULL)
        goto done;
    if (seg == Py_None || refusal != Py_None)
        goto answer;
    long long seg_start, size;
    if ((writer = PyObject_GetAttr(bw, s_writer)) == NULL || (ids = PyObject_GetAttr(bw, s_ids)) == NULL ||
        (positions = PyObject_GetAttr(bw, s_positions)) == NULL || (view = PyObject_GetAttr(seg, s_view)) == NULL ||
        !get_ll(seg, s_start, &seg_start) || !get_ll(seg, s_size, &size))
        goto done;
    while (i < n) {
        PyObject *topic = frame_field(frames, i, 0), *partition = frame_field(frames, i, 1);
        if (topic == NULL || partition == NULL)
            goto done;
        if (!PyBytes_Check(topic)) {
            PyErr_SetString(PyExc_TypeError, "a burst frame's topic must be bytes");
            goto done;
        }
        Py_ssize_t j = i + 1;
        while (j < n) {
            PyObject *pj = frame_field(frames, j, 1), *tj = pj ? frame_field(frames, j, 0) : NULL;
            if (tj == NULL)
                goto done;
            int same = PyObject_RichCompareBool(pj, partition, Py_EQ);
            if (same < 0)
                goto done;
            if (!same || tj != topic)
                break;
            j++;
        }
        PyObject *name = PyUnicode_DecodeASCII(PyBytes_AS_STRING(topic), PyBytes_GET_SIZE(topic), NULL);
        PyObject *key = name == NULL ? NULL : PyTuple_Pack(2, name, partition);
        Py_XDECREF(name);
        PyObject *p = key == NULL ? NULL : PyObject_CallOneArg(writer, key);
        Py_XDECREF(key);
        if (p == NULL)
            goto done;
        if (p == Py_None) {
            Py_DECREF(p);
            break;
        }
        long part = PyLong_AsLong(partition);
        if (part == -1 && PyErr_Occurred()) {
            Py_DECREF(p);
            goto done;
        }
        Py_ssize_t overhead = fixed + PyBytes_GET_SIZE(topic);
        while (i < j) {
            long long off, fast_end, written, length, ready, tstart;
            PyObject *len_obj = frame_field(frames, i, 5);
            if (len_obj == NULL || !get_ll(p, s_max, &off) || !get_ll(p, s_fast_end, &fast_end) ||
                !get_ll(positions, s_written, &written) || (length = PyLong_AsLongLong(len_obj), PyErr_Occurred())) {
                Py_DECREF(p);
                goto done;
            }
            long long room = fast_end - off, rel = written - seg_start, first = rel + overhead + length;
            if (room <= 0 || first > size || rel < 0) {
                Py_DECREF(p);
                goto answer;
            }
            if (!get_ll(seg, s_ready, &ready)) {
                Py_DECREF(p);
                goto done;
            }
            if (first > ready) { /* as CommitLog.make_room does for a put (and then it writes the record anyway) */
                PyObject *rel_obj = PyLong_FromLongLong(rel);
                PyObject *r = rel_obj == NULL ? NULL : PyObject_CallMethodOneArg(seg, s_advance_ready, rel_obj);
                Py_XDECREF(rel_obj);
                Py_XDECREF(r);
                if (r == NULL || !get_ll(seg, s_ready, &ready)) {
                    Py_DECREF(p);
                    goto done;
                }
                if (first > ready)
                    ready = first;
            }
            PyObject *t = PyObject_GetAttr(p, s_tail), *mm = t ? PyObject_GetAttr(t, s_mm) : NULL;
            int ok = mm != NULL && get_ll(t, s_start, &tstart);
            Py_XDECREF(t);
            if (!ok) {
                Py_XDECREF(mm);
                Py_DECREF(p);
                goto done;
            }
            PyObject *call = Py_BuildValue("(OOOLLLOOnnLOlOLOOOOLn)", runs, run_type, view, seg_start, rel, ready, src,
                                           frames, i, j, room, topic, part, p, off, now, ids, positions, mm,
                                           (off - tstart) * (long long)unit_size, overhead);
            Py_DECREF(mm);
            PyObject *count = call == NULL ? NULL : append_run(self, call);
            Py_XDECREF(call);
            if (count == NULL) {
                Py_DECREF(p);
                goto done;
            }
            Py_ssize_t c = PyLong_AsSsize_t(count);
            Py_DECREF(count);
            if (c == -1 && PyErr_Occurred()) {
                Py_DECREF(p);
                goto done;
            }
            i += c;
        }
        Py_DECREF(p);
    }
answer:
    result = Py_BuildValue("(nO)", i, runs);
done:
    Py_XDECREF(view);
    Py_XDECREF(positions);
    Py_XDECREF(ids);
    Py_XDECREF(writer);
    Py_XDECREF(refusal);
    Py_XDECREF(seg);
    Py_XDECREF(log);
    Py_DECREF(runs);
    return result;
}
