/*
 * Recovery's scan of a commit-log segment in C (metaq.native._bytes.scan_log and write_units), and the key index's
 * walk over the flushed log (keyed_records).
 *
 *   scan_log(buf, rel, size, base, max_records)  == metaq.store.recovery_scan.scan_log_py
 *   write_units(dst, at, src, src_at, n)         == metaq.store.recovery_scan.write_units_py
 *   keyed_records(buf, rel, stop, end)           == metaq.keys.index.keyed_records_py
 *
 * scan_log checks the records from rel on exactly as metaq.store.record.check_record does (magic, sizes, CRC)
 * and stops at the first one that fails (or after max_records, or at size). It returns, in one call, what the
 * index needs of the valid records: their index units (position, size, tag hash; 16 bytes each, big-endian as
 * metaq.store.index.UNIT) grouped into runs of one topic-partition with consecutive queue offsets, so the
 * caller writes each run into the index files with one write_units call instead of one Python call per record.
 *
 * The records are checked without the GIL (CRC-32 is most of the work) into a C array; the runs are formed and
 * the Python objects built after.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native.h"

#define MESSAGE_MAGIC 0xDA7A4D51u
#define PREFIX_SIZE 42
#define HEADER_SIZE 20
#define CRC_START 12
#define UNIT_SIZE 16
#define MIN_RECORD (PREFIX_SIZE + HEADER_SIZE + 1)

typedef struct {
    Py_ssize_t rel;   /* where the record starts in the segment */
    int32_t total;    /* its size */
    int32_t tlen;     /* its topic's length (the topic starts at rel + PREFIX_SIZE) */
    int32_t partition;
    int32_t tag;      /* the index unit's tag hash */
    int64_t offset;   /* its queue offset */
    Py_ssize_t key;   /* index of its topic-partition in the key table's order of first appearance */
    Py_ssize_t group; /* the run it belongs to */
} Rec;

typedef struct {
    Py_ssize_t key;
    int64_t first, last;
    Py_ssize_t n, start, filled;
} Run;

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t be64(const unsigned char *p) {
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* check_record(r, 0, left) == total, given MIN_RECORD <= total <= left: magic, topic length, msgLen, CRC. */
static int valid_record(const unsigned char *r, int32_t total) {
    if (be32(r + 4) != MESSAGE_MAGIC)
        return 0;
    int32_t tlen = (int16_t)(uint16_t)((r[40] << 8) | r[41]);
    if (tlen < 1 || PREFIX_SIZE + HEADER_SIZE + (int64_t)tlen > total)
        return 0;
    int64_t msg_len = (int32_t)be32(r + PREFIX_SIZE + tlen);
    if (PREFIX_SIZE + HEADER_SIZE + (int64_t)tlen + msg_len != total)
        return 0;
    return (uint32_t)metaq_crc(r + CRC_START, (Py_ssize_t)total - CRC_START, 0) == be32(r + 8);
}

/* metaq.store.record.tag_hash(flag, data) for data of n bytes: tag_code of the attribute's bytes before its
 * first \x02 (when flag & 1 and the attribute block is well formed), else 0. */
static int32_t tag_hash(int32_t flag, const unsigned char *data, int64_t n) {
    if (!(flag & 1) || n < 4)
        return 0;
    int64_t alen = (int32_t)be32(data);
    if (alen < 0 || alen + 4 > n)
        return 0;
    const unsigned char *sep = memchr(data + 4, 2, (size_t)alen);
    Py_ssize_t tlen = sep != NULL ? (Py_ssize_t)(sep - (data + 4)) : (Py_ssize_t)alen;
    return tlen ? (int32_t)(metaq_crc(data + 4, tlen, 0) & 0x7FFFFFFFul) : 0;
}

static uint64_t key_hash(const unsigned char *topic, int32_t tlen, int32_t partition) {
    uint64_t h = 1469598103934665603ull ^ (uint32_t)partition; /* FNV-1a */
    for (int32_t i = 0; i < tlen; i++)
        h = (h ^ topic[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

/* Check records from rel while they are valid; fills recs (at most max) and the largest msgId. Returns the
 * count; *stop is where the scan stopped. No Python calls: runs without the GIL. */
static Py_ssize_t check_run(const unsigned char *buf, Py_ssize_t rel, Py_ssize_t size, Py_ssize_t max, Rec *recs,
                            Py_ssize_t *stop, int64_t *max_id) {
    Py_ssize_t count = 0;
    while (count < max && size - rel >= MIN_RECORD) {
        const unsigned char *r = buf + rel;
        int32_t total = (int32_t)be32(r);
        if (total < MIN_RECORD || total > size - rel || !valid_record(r, total))
            break;
        Rec *x = recs + count++;
        int32_t tlen = (int16_t)(uint16_t)((r[40] << 8) | r[41]);
        const unsigned char *h = r + PREFIX_SIZE + tlen;
        int64_t msg_id = (int64_t)be64(h + 8);
        if (count == 1 || msg_id > *max_id)
            *max_id = msg_id;
        x->rel = rel;
        x->total = total;
        x->tlen = tlen;
        x->partition = (int32_t)be32(r + 12);
        x->offset = (int64_t)be64(r + 16);
        x->tag = tag_hash((int32_t)be32(h + 16), h + HEADER_SIZE, (int64_t)(int32_t)be32(h));
        rel += total;
    }
    *stop = rel;
    return count;
}

/* Give each record its key (topic, partition) and its run; returns the number of runs, or -1 (no memory). */
static Py_ssize_t form_runs(const unsigned char *buf, Rec *recs, Py_ssize_t count, Run *runs, Py_ssize_t *keys,
                            Py_ssize_t *nkeys) {
    Py_ssize_t cap = 16;
    while (cap < 2 * count)
        cap *= 2;
    Py_ssize_t *table = malloc((size_t)cap * sizeof(Py_ssize_t)); /* key slots: the key's first record, or -1 */
    Py_ssize_t *current = malloc((size_t)(count ? count : 1) * sizeof(Py_ssize_t)); /* per key: its open run */
    if (table == NULL || current == NULL) {
        free(table);
        free(current);
        return -1;
    }
    for (Py_ssize_t i = 0; i < cap; i++)
        table[i] = -1;
    Py_ssize_t nruns = 0, k = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Rec *x = recs + i;
        const unsigned char *topic = buf + x->rel + PREFIX_SIZE;
        Py_ssize_t key;
        if (i > 0 && x->partition == recs[i - 1].partition && x->tlen == recs[i - 1].tlen &&
            memcmp(topic, buf + recs[i - 1].rel + PREFIX_SIZE, (size_t)x->tlen) == 0) {
            key = recs[i - 1].key; /* the common case: the same partition as the record before */
        } else {
            Py_ssize_t slot = (Py_ssize_t)(key_hash(topic, x->tlen, x->partition) & (uint64_t)(cap - 1));
            for (;;) {
                Py_ssize_t j = table[slot];
                if (j < 0) {
                    table[slot] = i;
                    keys[k] = i;
                    current[k] = -1;
                    key = k++;
                    break;
                }
                Rec *y = recs + j;
                if (y->partition == x->partition && y->tlen == x->tlen &&
                    memcmp(topic, buf + y->rel + PREFIX_SIZE, (size_t)x->tlen) == 0) {
                    key = y->key;
                    break;
                }
                slot = (slot + 1) & (cap - 1);
            }
        }
        x->key = key;
        Py_ssize_t g = current[key];
        if (g >= 0 && runs[g].last != INT64_MAX && x->offset == runs[g].last + 1) {
            runs[g].last = x->offset;
            runs[g].n++;
        } else {
            g = current[key] = nruns++;
            runs[g].key = key;
            runs[g].first = runs[g].last = x->offset;
            runs[g].n = 1;
            runs[g].filled = 0;
        }
        x->group = g;
    }
    free(table);
    free(current);
    *nkeys = k;
    return nruns;
}

/* The (units, runs) result: the units of every run, run after run, and one tuple per run. NULL with an error. */
static PyObject *build_result(const unsigned char *buf, Py_ssize_t base, Rec *recs, Py_ssize_t count, Run *runs,
                              Py_ssize_t nruns, Py_ssize_t *keys, Py_ssize_t nkeys) {
    PyObject *units = PyBytes_FromStringAndSize(NULL, count * UNIT_SIZE);
    PyObject *list = PyList_New(nruns);
    PyObject **topics = calloc((size_t)(nkeys ? nkeys : 1), sizeof(PyObject *));
    if (units == NULL || list == NULL || topics == NULL)
        goto fail;
    for (Py_ssize_t k = 0; k < nkeys; k++) {
        Rec *x = recs + keys[k];
        topics[k] = PyBytes_FromStringAndSize((const char *)buf + x->rel + PREFIX_SIZE, x->tlen);
        if (topics[k] == NULL)
            goto fail;
    }
    Py_ssize_t at = 0;
    for (Py_ssize_t g = 0; g < nruns; g++) {
        runs[g].start = at;
        at += runs[g].n;
        PyObject *t = Py_BuildValue("(OiLnn)", topics[runs[g].key], (int)recs[keys[runs[g].key]].partition,
                                    (long long)runs[g].first, runs[g].start, runs[g].n);
        if (t == NULL)
            goto fail;
        PyList_SET_ITEM(list, g, t);
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(units);
    for (Py_ssize_t i = 0; i < count; i++) {
        Rec *x = recs + i;
        Run *g = runs + x->group;
        unsigned char *u = out + (g->start + g->filled++) * UNIT_SIZE;
        uint64_t pos = (uint64_t)base + (uint64_t)x->rel;
        put_be32(u, (uint32_t)(pos >> 32));
        put_be32(u + 4, (uint32_t)pos);
        put_be32(u + 8, (uint32_t)x->total);
        put_be32(u + 12, (uint32_t)x->tag);
    }
    for (Py_ssize_t k = 0; k < nkeys; k++)
        Py_DECREF(topics[k]);
    free(topics);
    PyObject *result = PyTuple_Pack(2, units, list);
    Py_DECREF(units);
    Py_DECREF(list);
    return result;
fail:
    if (topics != NULL)
        for (Py_ssize_t k = 0; k < nkeys; k++)
            Py_XDECREF(topics[k]);
    free(topics);
    Py_XDECREF(units);
    Py_XDECREF(list);
    return NULL;
}

PyObject *scan_log(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t rel, size, base, max_records;
    if (!PyArg_ParseTuple(args, "Onnnn", &obj, &rel, &size, &base, &max_records))
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    if (rel < 0 || rel > size || size > b.len || max_records < 1) {
        PyErr_Format(PyExc_ValueError, "need 0 <= rel <= size <= %zd and max_records >= 1", b.len);
        PyBuffer_Release(&b);
        return NULL;
    }
    if (base < 0 || base > PY_SSIZE_T_MAX - size) { /* every record's log position fits an int64 */
        PyErr_Format(PyExc_ValueError, "a segment's base must be from 0 to 2**63-1 less its size, not %zd", base);
        PyBuffer_Release(&b);
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)b.buf;
    /* No more records than can fit: a small segment needs no max_records-sized arrays. */
    Py_ssize_t max = (size - rel) / MIN_RECORD;
    if (max > max_records)
        max = max_records;
    Rec *recs = malloc((size_t)(max ? max : 1) * sizeof(Rec));
    Run *runs = malloc((size_t)(max ? max : 1) * sizeof(Run));
    Py_ssize_t *keys = malloc((size_t)(max ? max : 1) * sizeof(Py_ssize_t));
    PyObject *result = NULL, *batch = NULL;
    if (recs == NULL || runs == NULL || keys == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t stop, count, nkeys = 0, nruns;
    int64_t max_id = 0;
    Py_BEGIN_ALLOW_THREADS
    count = check_run(buf, rel, size, max, recs, &stop, &max_id);
    nruns = form_runs(buf, recs, count, runs, keys, &nkeys);
    Py_END_ALLOW_THREADS
    if (nruns < 0) {
        PyErr_NoMemory();
        goto done;
    }
    batch = build_result(buf, base, recs, count, runs, nruns, keys, nkeys);
    if (batch == NULL)
        goto done;
    if (count)
        result = Py_BuildValue("(nnLOO)", stop, count, (long long)max_id, PyTuple_GET_ITEM(batch, 0),
                               PyTuple_GET_ITEM(batch, 1));
    else
        result = Py_BuildValue("(nnOOO)", stop, count, Py_None, PyTuple_GET_ITEM(batch, 0),
                               PyTuple_GET_ITEM(batch, 1));
done:
    Py_XDECREF(batch);
    free(recs);
    free(runs);
    free(keys);
    PyBuffer_Release(&b);
    return result;
}

PyObject *write_units(PyObject *self, PyObject *args) {
    PyObject *dst_obj, *src_obj;
    Py_ssize_t at, src_at, n;
    if (!PyArg_ParseTuple(args, "OnOnn", &dst_obj, &at, &src_obj, &src_at, &n))
        return NULL;
    Py_buffer d, s;
    if (PyObject_GetBuffer(dst_obj, &d, PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(src_obj, &s, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&d);
        return NULL;
    }
    Py_ssize_t changed = 0;
    if (n < 0 || at < 0 || src_at < 0 || n > (d.len - at) / UNIT_SIZE || at > d.len ||
        n > (s.len - src_at) / UNIT_SIZE || src_at > s.len) {
        PyErr_SetString(PyExc_ValueError, "units out of range");
        changed = -1;
    } else {
        unsigned char *dp = (unsigned char *)d.buf + at;
        const unsigned char *sp = (const unsigned char *)s.buf + src_at;
        if (memcmp(dp, sp, (size_t)(n * UNIT_SIZE)) != 0) {
            for (Py_ssize_t i = 0; i < n; i++, dp += UNIT_SIZE, sp += UNIT_SIZE) {
                if (memcmp(dp, sp, UNIT_SIZE) != 0) {
                    memcpy(dp, sp, UNIT_SIZE);
                    changed++;
                }
            }
        }
    }
    PyBuffer_Release(&s);
    PyBuffer_Release(&d);
    return changed < 0 ? NULL : PyLong_FromSsize_t(changed);
}

/* nonzero_end(buf, start, end) == metaq.store.mapped.nonzero_end_py: one past the last non-zero byte of
 * buf[start:end], or start when they are all zero. Reads the map in place (recovery's look at what lies after
 * its stop point: often the zero rest of a 1 GiB segment), without the GIL. */
PyObject *nonzero_end(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "Onn", &obj, &start, &end))
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    if (start < 0 || end > b.len) {
        PyErr_Format(PyExc_ValueError, "need 0 <= start and end <= %zd", b.len);
        PyBuffer_Release(&b);
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)b.buf;
    Py_ssize_t hi = end;
    Py_BEGIN_ALLOW_THREADS
    while (hi > start && (hi & 63) != 0 && p[hi - 1] == 0)
        hi--;
    while (hi - 64 >= start && hi > start && p[hi - 1] == 0) { /* 64 zero bytes at a time, aligned */
        uint64_t acc = 0, w;
        for (int i = 1; i <= 8; i++) {
            memcpy(&w, p + hi - 8 * i, 8);
            acc |= w;
        }
        if (acc != 0)
            break;
        hi -= 64;
    }
    while (hi > start && p[hi - 1] == 0)
        hi--;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyLong_FromSsize_t(hi > start ? hi : start);
}

/* keyed_records(buf, rel, stop, end) == metaq.keys.index.keyed_records_py: walk the records from rel (while
 * rel < stop and a marker fits before end; a marker that is not a message's, or a size that is not positive or
 * runs past end, stops the walk) and return (where the walk stopped, [rel of each record whose header flag has
 * the attribute bit]). The key index's catch-up looks only at those: most records carry no attribute, and one
 * Python call per record was a fifth of the event loop's time under a pipelined load. A record too short to hold
 * its flag (total < 42, a negative topic length, the flag past its end) has none. */
PyObject *keyed_records(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t rel, stop, end;
    if (!PyArg_ParseTuple(args, "Onnn", &obj, &rel, &stop, &end))
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    if (rel < 0 || end > b.len) {
        PyErr_Format(PyExc_ValueError, "need 0 <= rel and end <= %zd", b.len);
        PyBuffer_Release(&b);
        return NULL;
    }
    PyObject *keyed = PyList_New(0);
    if (keyed == NULL) {
        PyBuffer_Release(&b);
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)b.buf;
    while (rel < stop && end - rel >= 8) {
        int32_t total = (int32_t)be32(p + rel);
        if (be32(p + rel + 4) != MESSAGE_MAGIC || total <= 0 || total > end - rel)
            break;
        if (total >= PREFIX_SIZE) {
            int32_t tlen = (int16_t)(uint16_t)((p[rel + 40] << 8) | p[rel + 41]);
            int64_t flag_at = (int64_t)PREFIX_SIZE + tlen + 16; /* from rel */
            if (tlen >= 0 && flag_at + 4 <= total && (be32(p + rel + flag_at) & 1)) {
                PyObject *v = PyLong_FromSsize_t(rel);
                if (v == NULL || PyList_Append(keyed, v) < 0) {
                    Py_XDECREF(v);
                    Py_DECREF(keyed);
                    PyBuffer_Release(&b);
                    return NULL;
                }
                Py_DECREF(v);
            }
        }
        rel += total;
    }
    PyBuffer_Release(&b);
    return Py_BuildValue("(nN)", rel, keyed);
}
