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
    PyObject *v = metaq_getattr(obj, name);
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
    int rc = metaq_setattr(obj, name, v);
    Py_DECREF(v);
    return rc == 0;
}

/* obj.name += add; 0 with an exception set. */
static int add_ll(PyObject *obj, PyObject *name, long long add) {
    long long v;
    return get_ll(obj, name, &v) && set_ll(obj, name, v + add);
}

PyObject *append_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *runs, *run_type, *log_obj, *src_obj, *frames, *topic_obj, *p, *ids, *positions, *index_obj;
    long long seg_start, off, now_ms;
    Py_ssize_t rel, ready, i, j, room, unit_at, overhead;
    long partition;
    if (!metaq_nargs(nargs, 21) || !metaq_arg_type(1, args[0], &PyList_Type) || !metaq_arg_ll(args[3], &seg_start) ||
        !metaq_arg_ssize(args[4], &rel) || !metaq_arg_ssize(args[5], &ready) || !metaq_arg_ssize(args[8], &i) ||
        !metaq_arg_ssize(args[9], &j) || !metaq_arg_ssize(args[10], &room) ||
        !metaq_arg_type(12, args[11], &PyBytes_Type) || !metaq_arg_long(args[12], &partition) ||
        !metaq_arg_ll(args[14], &off) || !metaq_arg_ll(args[15], &now_ms) || !metaq_arg_ssize(args[19], &unit_at) ||
        !metaq_arg_ssize(args[20], &overhead))
        return NULL;
    runs = args[0], run_type = args[1], log_obj = args[2], src_obj = args[6], frames = args[7], topic_obj = args[11];
    p = args[13], ids = args[16], positions = args[17], index_obj = args[18];
    if (!interned())
        return NULL;
    if (!PyType_Check(run_type) || !PyType_IsSubtype((PyTypeObject *)run_type, &PyTuple_Type))
        return PyErr_Format(PyExc_TypeError, "run_type must be a tuple type");
    /* IdGenerator.take(now_ms, min(j - i, room)) */
    long long want = j - i < room ? j - i : room, ts = now_ms - TWEPOCH, seq = 0, cur, bits;
    PyObject *ts_obj = metaq_getattr(ids, s_ts);
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
    if (!set_ll(positions, s_written, end) || !set_ll(p, s_max, vis) || metaq_setattr(p, s_dirty, Py_True) < 0)
        return NULL;
    PyObject *async_visible = metaq_getattr(positions, s_async_visible);
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
        PyObject *pending = metaq_getattr(positions, s_pending);
        if (pending == NULL)
            return NULL;
        PyObject *end_obj = PyLong_FromLongLong(end), *vis_obj = PyLong_FromLongLong(vis);
        PyObject *entry = end_obj != NULL && vis_obj != NULL ? PyTuple_Pack(3, end_obj, p, vis_obj) : NULL;
        Py_XDECREF(end_obj);
        Py_XDECREF(vis_obj);
        PyObject *r = entry == NULL ? NULL : PyObject_CallMethodOneArg(pending, s_append, entry);
        Py_XDECREF(entry);
        Py_DECREF(pending);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    PyObject *log_bytes = metaq_getattr(p, s_log_bytes);
    if (log_bytes == NULL)
        return NULL;
    int has_bytes = log_bytes != Py_None;
    Py_DECREF(log_bytes);
    if (has_bytes && !add_ll(p, s_log_bytes, nbytes))
        return NULL;
    if (!add_ll(positions, s_unflushed, count) || !add_ll(positions, s_appended, count))
        return NULL;
    /* the run's BurstRun: (key, count, body bytes, first id, first offset, first frame, log end) */
    PyObject *key = metaq_getattr(p, s_key);
    if (key == NULL)
        return NULL;
    /* made as tuple.__new__(run_type, fields) makes it: a tuple subtype's instance is allocated by the type and its
       items set (the type's tp_alloc tracks it for the collector) */
    PyTypeObject *rt = (PyTypeObject *)run_type;
    PyObject *run = rt == &PyTuple_Type ? PyTuple_New(7) : rt->tp_alloc(rt, 7);
    if (run == NULL) {
        Py_DECREF(key);
        return NULL;
    }
    PyTuple_SET_ITEM(run, 0, key);
    PyObject *v[6] = {PyLong_FromSsize_t(count), PyLong_FromLongLong(nbytes - (long long)count * overhead),
                      PyLong_FromLongLong(first_id), PyLong_FromLongLong(off), PyLong_FromSsize_t(i),
                      PyLong_FromLongLong(end)};
    int bad = 0;
    for (int k = 0; k < 6; k++) {
        bad |= v[k] == NULL;
        PyTuple_SET_ITEM(run, k + 1, v[k]); /* a NULL item is one the tuple's dealloc skips */
    }
    if (bad) {
        Py_DECREF(run);
        return NULL;
    }
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
