/* The commit log's records: a burst's run written as records and index units, records checked and scanned, the
 * CRC-32, and a read's records gathered or checked as ranges (metaq.store.batch, record, gather). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#define MESSAGE_MAGIC 0xDA7A4D51u
#define PREFIX_SIZE 42 /* total, magic, crc, partition, queue_offset, store_ts, born_ts, topic_len */
#define HEADER_SIZE 20 /* msgLen, checksum, msgId, flag */
#define CRC_START 12
#define UNIT_SIZE 16

#include "native.h"

static void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void put64(unsigned char *p, uint64_t v) {
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

/* The fields of one frame tuple that write_run needs (the 8th, when there is one, is the index unit's tag hash:
   scan_idem_burst's frames; the 9th, when there is one and it is a buffer (an idempotent put's is its producer id),
   holds the body's last bytes, the first ones in src: a copy whose payload stays in the frame it came in); 0 with an
   exception set on bad input. */
static int frame_fields(PyObject *t, long long *flag, Py_ssize_t *start, Py_ssize_t *n, unsigned long *crc,
                        uint32_t *tag) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 7) {
        PyErr_SetString(PyExc_TypeError, "a frame is a tuple from scan_puts or scan_idem_burst");
        return 0;
    }
    *flag = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 2));
    *start = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 4));
    *n = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 5));
    *crc = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(t, 6));
    *tag = PyTuple_GET_SIZE(t) > 7 ? (uint32_t)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(t, 7)) : 0;
    if (PyErr_Occurred())
        return 0;
    if (*start < 0 || *n < 0 || *n > INT32_MAX_V || *flag < -INT32_MAX_V - 1 || *flag > INT32_MAX_V) {
        PyErr_SetString(PyExc_ValueError, "frame fields out of range");
        return 0;
    }
    return 1;
}

/* zlib's operator that shifts a CRC past n bytes (crc32_combine_gen64(n)), remembered for the last lengths seen
   across calls: a publisher's bodies mostly share a few lengths and a run is often one record, so generating it per
   run costs more than the record's own CRC. Direct-mapped by length; a slot holds n + 1 (0: empty). Every caller
   holds the GIL, which is what keeps the static table consistent. */
#define CRC_OPS 16
static struct {
    Py_ssize_t len1;
    uLong op;
} crc_ops[CRC_OPS];

static uLong crc_shift_op(Py_ssize_t n) {
    unsigned slot = (unsigned)(((size_t)n * 0x9E3779B1u) >> 16) % CRC_OPS;
    if (crc_ops[slot].len1 != n + 1) {
        crc_ops[slot].op = crc32_combine_gen64((z_off64_t)n);
        crc_ops[slot].len1 = n + 1;
    }
    return crc_ops[slot].op;
}

/* write_run's records written into held buffers (log[rel:], index[unit_at:]); the count, *rel moved past them; -1 with
   an exception set on bad input. */
static Py_ssize_t metaq_write_records(const Py_buffer *lb, const Py_buffer *sb, const Py_buffer *ib,
                                      PyObject *frames, Py_ssize_t i, Py_ssize_t j, PyObject *topic_obj,
                                      long partition, long long seg_start, Py_ssize_t *relp, Py_ssize_t ready,
                                      long long offset, long long now_ms, long long first_id, Py_ssize_t unit_at) {
    if (!PyList_Check(frames)) {
        PyErr_SetString(PyExc_TypeError, "frames must be a list");
        return -1;
    }
    Py_ssize_t tlen = PyBytes_GET_SIZE(topic_obj), rel = *relp;
    if (tlen > 32767) {
        PyErr_Format(PyExc_ValueError, "topic of %zd bytes", tlen);
        return -1;
    }
    if (j > PyList_GET_SIZE(frames))
        j = PyList_GET_SIZE(frames);
    if (i < 0 || rel < 0 || ready > lb->len || unit_at < 0) {
        PyErr_SetString(PyExc_ValueError, "position out of range");
        return -1;
    }
    unsigned char *log = (unsigned char *)lb->buf, *index = (unsigned char *)ib->buf;
    const unsigned char *src = (const unsigned char *)sb->buf;
    const char *topic = PyBytes_AS_STRING(topic_obj);
    Py_ssize_t hsize = PREFIX_SIZE + tlen + HEADER_SIZE, count = 0, op_len = -1;
    uLong op = 0;
    for (Py_ssize_t k = i; k < j; k++, count++) {
        long long flag;
        Py_ssize_t start, n;
        unsigned long crc;
        uint32_t tag;
        if (!frame_fields(PyList_GET_ITEM(frames, k), &flag, &start, &n, &crc, &tag))
            return -1;
        Py_ssize_t total = hsize + n;
        if (rel + total > ready)
            break;
        PyObject *tail_obj = PyTuple_GET_SIZE(PyList_GET_ITEM(frames, k)) > 8
                                 ? PyTuple_GET_ITEM(PyList_GET_ITEM(frames, k), 8) : Py_None;
        if (!PyObject_CheckBuffer(tail_obj))
            tail_obj = Py_None; /* an idempotent put's ninth field is its producer id, not a tail */
        Py_buffer tb;
        tb.len = 0;
        if (tail_obj != Py_None && PyObject_GetBuffer(tail_obj, &tb, PyBUF_SIMPLE) < 0)
            return -1;
        Py_ssize_t head_n = n - tb.len;
        if (head_n < 0 || start + head_n > sb->len || unit_at + (count + 1) * UNIT_SIZE > ib->len) {
            if (tail_obj != Py_None)
                PyBuffer_Release(&tb);
            PyErr_SetString(PyExc_ValueError, "body or index unit out of range");
            return -1;
        }
        long long msg_id = first_id + count, qoff = offset + count;
        unsigned char *r = log + rel;
        put32(r, (uint32_t)total);
        put32(r + 4, MESSAGE_MAGIC);
        put32(r + 12, (uint32_t)partition);
        put64(r + 16, (uint64_t)qoff);
        put64(r + 24, (uint64_t)now_ms);
        put64(r + 32, (uint64_t)now_ms);
        r[40] = (unsigned char)(tlen >> 8);
        r[41] = (unsigned char)tlen;
        memcpy(r + PREFIX_SIZE, topic, tlen);
        unsigned char *h = r + PREFIX_SIZE + tlen;
        put32(h, (uint32_t)n);
        put32(h + 4, (uint32_t)(crc & 0x7FFFFFFFul));
        put64(h + 8, (uint64_t)msg_id);
        put32(h + 16, (uint32_t)flag);
        memcpy(r + hsize, src + start, head_n);
        if (tail_obj != Py_None) {
            memcpy(r + hsize + head_n, tb.buf, tb.len);
            PyBuffer_Release(&tb);
        }
        unsigned long hcrc = crc_of(r + CRC_START, hsize - CRC_START, 0);
        if (n != op_len) {
            op = crc_shift_op(n);
            op_len = n;
        }
        put32(r + 8, (uint32_t)crc32_combine_op(hcrc, crc, op));
        unsigned char *u = index + unit_at + count * UNIT_SIZE;
        put64(u, (uint64_t)(seg_start + rel));
        put32(u + 8, (uint32_t)total);
        put32(u + 12, tag);
        rel += total;
    }
    *relp = rel;
    return count;
}

/* The log, body and index buffers write_run writes through; 0 with an exception set. */
static int metaq_run_buffers(PyObject *log_obj, PyObject *src_obj, PyObject *index_obj, Py_buffer *lb,
                             Py_buffer *sb, Py_buffer *ib) {
    if (PyObject_GetBuffer(log_obj, lb, PyBUF_WRITABLE) < 0)
        return 0;
    if (PyObject_GetBuffer(src_obj, sb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(lb);
        return 0;
    }
    if (PyObject_GetBuffer(index_obj, ib, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(sb);
        PyBuffer_Release(lb);
        return 0;
    }
    return 1;
}

PyObject *write_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *log_obj, *src_obj, *frames, *topic_obj, *index_obj;
    long long seg_start, offset, now_ms, first_id;
    Py_ssize_t rel, ready, i, j, unit_at;
    long partition;
    if (!metaq_nargs(nargs, 15) || !metaq_arg_ll(args[1], &seg_start) || !metaq_arg_ssize(args[2], &rel)
        || !metaq_arg_ssize(args[3], &ready) || !metaq_arg_ssize(args[6], &i) || !metaq_arg_ssize(args[7], &j)
        || !metaq_arg_type(9, args[8], &PyBytes_Type) || !metaq_arg_long(args[9], &partition)
        || !metaq_arg_ll(args[10], &offset) || !metaq_arg_ll(args[11], &now_ms) || !metaq_arg_ll(args[12], &first_id)
        || !metaq_arg_ssize(args[14], &unit_at))
        return NULL;
    log_obj = args[0], src_obj = args[4], frames = args[5], topic_obj = args[8], index_obj = args[13];
    Py_buffer lb, sb, ib;
    if (!metaq_run_buffers(log_obj, src_obj, index_obj, &lb, &sb, &ib))
        return NULL;
    Py_ssize_t count = metaq_write_records(&lb, &sb, &ib, frames, i, j, topic_obj, partition, seg_start, &rel, ready,
                                           offset, now_ms, first_id, unit_at);
    PyBuffer_Release(&ib);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&lb);
    if (count < 0)
        return NULL;
    PyObject *out = PyTuple_New(2), *c = PyLong_FromSsize_t(count), *r = PyLong_FromSsize_t(rel);
    if (out == NULL || c == NULL || r == NULL) {
        Py_XDECREF(out);
        Py_XDECREF(c);
        Py_XDECREF(r);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, c);
    PyTuple_SET_ITEM(out, 1, r);
    return out;
}

static uint32_t get32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

#define MIN_RECORD (PREFIX_SIZE + HEADER_SIZE + 1)
#define GATHER_END 0     /* the units ran out, or the next is not a whole record of this segment */
#define GATHER_FULL 1    /* the next record would pass the limit */
#define GATHER_CORRUPT 2 /* the next record fails its check (verify) */

/* metaq.store.record.check_record(r, 0, size) == size: the record at r, of the size its index unit says, has the
 * magic, that total size, a consistent topic length and msgLen, and a matching CRC. */
static int record_ok(const unsigned char *r, long long size) {
    if (size < MIN_RECORD || get32(r + 4) != MESSAGE_MAGIC || (long long)(int32_t)get32(r) != size)
        return 0;
    long long tlen = (int16_t)(uint16_t)((r[40] << 8) | r[41]);
    if (tlen < 1 || PREFIX_SIZE + HEADER_SIZE + tlen > size)
        return 0;
    long long msg_len = (int32_t)get32(r + PREFIX_SIZE + tlen);
    if (PREFIX_SIZE + HEADER_SIZE + tlen + msg_len != size)
        return 0;
    return (uint32_t)crc_of(r + CRC_START, (Py_ssize_t)(size - CRC_START), 0) == get32(r + 8);
}

/* The record at r (of ``size`` bytes, checked by record_ok) is record ``offset`` of partition ``partition`` of
 * ``topic``: what its index unit says it is. A damaged unit that points at another whole record (another topic's,
 * another offset's) passes record_ok; this refuses it. No topic: nothing to compare. */
static int record_is(const unsigned char *r, long long size, const char *topic, Py_ssize_t tlen, int partition,
                     long long offset) {
    if (topic == NULL)
        return 1;
    if (PREFIX_SIZE + tlen > size || (int32_t)get32(r + 12) != partition)
        return 0;
    if ((long long)(((uint64_t)get32(r + 16) << 32) | get32(r + 20)) != offset)
        return 0;
    if ((Py_ssize_t)(int16_t)(uint16_t)((r[40] << 8) | r[41]) != tlen)
        return 0;
    return memcmp(r + PREFIX_SIZE, topic, (size_t)tlen) == 0;
}

/* The owner arguments of gather_records and check_ranges: ``topic`` (bytes or None), the partition and the offset
 * of the first unit. 0 and a Python error when topic is neither bytes nor None. */
static int owner_of(PyObject *topic_obj, const char **topic, Py_ssize_t *tlen) {
    *topic = NULL;
    *tlen = 0;
    if (topic_obj == NULL || topic_obj == Py_None)
        return 1;
    if (!PyBytes_Check(topic_obj)) {
        PyErr_SetString(PyExc_TypeError, "topic must be bytes or None");
        return 0;
    }
    *topic = PyBytes_AS_STRING(topic_obj);
    *tlen = PyBytes_GET_SIZE(topic_obj);
    return 1;
}

/* gather_records' and check_ranges' first pass, over the units only (they may run far past the limit): how many
 * records fit ``limit`` (at least one) within the segment, their MetaQ forms' bytes in *total; *stop GATHER_FULL when
 * the limit stopped them (else left as it is). */
static Py_ssize_t count_units(const unsigned char *units, Py_ssize_t nunits, Py_ssize_t skip, Py_ssize_t log_len,
                              long long seg_start, long long seg_end, Py_ssize_t limit, Py_ssize_t nbytes,
                              Py_ssize_t *total, int *stop) {
    Py_ssize_t count = 0;
    for (; count < nunits; count++) {
        const unsigned char *u = units + count * UNIT_SIZE;
        long long phys = (long long)(((uint64_t)get32(u) << 32) | get32(u + 4));
        long long size = (int32_t)get32(u + 8), ln = size - skip;
        if (nbytes + *total + ln > limit && nbytes + *total > 0) {
            *stop = GATHER_FULL;
            break;
        }
        if (phys < seg_start || phys >= seg_end || ln < HEADER_SIZE || phys - seg_start + size > log_len)
            break;
        *total += ln;
    }
    return count;
}

PyObject *gather_records(PyObject *self, PyObject *args) {
    PyObject *units_obj, *log_obj;
    Py_ssize_t skip, limit, nbytes;
    long long seg_start, seg_end;
    int verify = 0, partition = 0;
    PyObject *topic_obj = NULL;
    long long first = 0;
    const char *topic;
    Py_ssize_t tlen;
    if (!PyArg_ParseTuple(args, "OnOLLnn|pOiL", &units_obj, &skip, &log_obj, &seg_start, &seg_end, &limit, &nbytes,
                          &verify, &topic_obj, &partition, &first) || !owner_of(topic_obj, &topic, &tlen))
        return NULL;
    Py_buffer ub, lb;
    if (PyObject_GetBuffer(units_obj, &ub, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(log_obj, &lb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&ub);
        return NULL;
    }
    const unsigned char *units = (const unsigned char *)ub.buf, *log = (const unsigned char *)lb.buf;
    Py_ssize_t nunits = ub.len / UNIT_SIZE, count = 0, total = 0;
    int stop = GATHER_END;
    /* First pass, over the units only: how many records, how many bytes. */
    count = count_units(units, nunits, skip, lb.len, seg_start, seg_end, limit, nbytes, &total, &stop);
    /* Second pass: each record checked (with verify) then copied while its bytes are still in the cache; the
     * copy stops before a corrupt record and the buffer is cut to what was copied. */
    PyObject *data = PyBytes_FromStringAndSize(NULL, total);
    if (data != NULL) {
        char *out = PyBytes_AS_STRING(data), *begin = out;
        for (Py_ssize_t k = 0; k < count; k++) {
            const unsigned char *u = units + k * UNIT_SIZE;
            long long phys = (long long)(((uint64_t)get32(u) << 32) | get32(u + 4));
            long long size = (int32_t)get32(u + 8);
            Py_ssize_t ln = (Py_ssize_t)(size - skip);
            const unsigned char *rec = log + (phys - seg_start);
            if (verify && (!record_ok(rec, size) || !record_is(rec, size, topic, tlen, partition, first + k))) {
                count = k;
                stop = GATHER_CORRUPT;
                break;
            }
            memcpy(out, rec + skip, ln);
            out += ln;
        }
        if (out - begin != total && _PyBytes_Resize(&data, out - begin) < 0)
            data = NULL;
    }
    PyBuffer_Release(&lb);
    PyBuffer_Release(&ub);
    if (data == NULL)
        return NULL;
    return Py_BuildValue("(nNi)", count, data, stop);
}

/* check_ranges(units, skip, log, seg_start, seg_end, limit, nbytes) == metaq.store.gather.check_ranges_py: as
 * gather_records with verify, every record checked in place, but nothing copied: the MetaQ forms' byte ranges in
 * ``log`` come back as native int64 (start, end) pairs (for send_ranges), with their total length. */
PyObject *check_ranges(PyObject *self, PyObject *args) {
    PyObject *units_obj, *log_obj;
    Py_ssize_t skip, limit, nbytes;
    long long seg_start, seg_end, first = 0;
    int partition = 0;
    PyObject *topic_obj = NULL;
    const char *topic;
    Py_ssize_t tlen;
    if (!PyArg_ParseTuple(args, "OnOLLnn|OiL", &units_obj, &skip, &log_obj, &seg_start, &seg_end, &limit, &nbytes,
                          &topic_obj, &partition, &first) || !owner_of(topic_obj, &topic, &tlen))
        return NULL;
    Py_buffer ub, lb;
    if (PyObject_GetBuffer(units_obj, &ub, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(log_obj, &lb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&ub);
        return NULL;
    }
    const unsigned char *units = (const unsigned char *)ub.buf, *log = (const unsigned char *)lb.buf;
    Py_ssize_t nunits = ub.len / UNIT_SIZE, count = 0, total = 0;
    int stop = GATHER_END;
    /* First pass, over the units only: how many records, how many bytes. */
    count = count_units(units, nunits, skip, lb.len, seg_start, seg_end, limit, nbytes, &total, &stop);
    /* Second pass: each record checked in place; the ranges stop before a corrupt one. */
    PyObject *ranges = PyBytes_FromStringAndSize(NULL, count * 2 * (Py_ssize_t)sizeof(int64_t));
    if (ranges != NULL) {
        int64_t *r = (int64_t *)PyBytes_AS_STRING(ranges);
        total = 0;
        for (Py_ssize_t k = 0; k < count; k++) {
            const unsigned char *u = units + k * UNIT_SIZE;
            long long phys = (long long)(((uint64_t)get32(u) << 32) | get32(u + 4));
            long long size = (int32_t)get32(u + 8), rel = phys - seg_start;
            if (!record_ok(log + rel, size) || !record_is(log + rel, size, topic, tlen, partition, first + k)) {
                count = k;
                stop = GATHER_CORRUPT;
                break;
            }
            r[2 * k] = rel + skip;
            r[2 * k + 1] = rel + size;
            total += size - skip;
        }
        Py_ssize_t used = count * 2 * (Py_ssize_t)sizeof(int64_t);
        if (used != PyBytes_GET_SIZE(ranges) && _PyBytes_Resize(&ranges, used) < 0)
            ranges = NULL;
    }
    PyBuffer_Release(&lb);
    PyBuffer_Release(&ub);
    if (ranges == NULL)
        return NULL;
    return Py_BuildValue("(nNni)", count, ranges, total, stop);
}

/* record_ok(buf, pos, size) == metaq.store.record.record_ok_py: one record checked in one call. */
PyObject *py_record_ok(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t pos, size;
    if (!PyArg_ParseTuple(args, "Onn", &obj, &pos, &size))
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    int ok = pos >= 0 && size >= 0 && pos <= b.len && size <= b.len - pos &&
             record_ok((const unsigned char *)b.buf + pos, size);
    PyBuffer_Release(&b);
    return PyBool_FromLong(ok);
}

/* scan_records(buf, pos, end) == metaq.store.record.scan_records_py: (where the run of valid records from pos
 * stops, how many records it holds). */
PyObject *scan_records(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t pos, end;
    if (!PyArg_ParseTuple(args, "Onn", &obj, &pos, &end))
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *buf = (const unsigned char *)b.buf;
    if (end > b.len)
        end = b.len;
    if (pos < 0)
        pos = end;
    Py_ssize_t count = 0;
    Py_BEGIN_ALLOW_THREADS /* only the buffer is read: a long scan (--verify, a replication chunk) lets others run */
    while (end - pos >= MIN_RECORD) {
        long long total = (int32_t)get32(buf + pos);
        if (total < MIN_RECORD || total > end - pos || !record_ok(buf + pos, total))
            break;
        pos += total;
        count++;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return Py_BuildValue("(nn)", pos, count);
}

PyObject *py_crc32(PyObject *self, PyObject *args) {
    Py_buffer b;
    unsigned long value = 0;
    if (!PyArg_ParseTuple(args, "y*|k", &b, &value))
        return NULL;
    unsigned long crc;
    if (b.len >= 4096) { /* long inputs (recovery scans, gathers) without the GIL */
        Py_BEGIN_ALLOW_THREADS
        crc = crc_of((const unsigned char *)b.buf, b.len, value & 0xFFFFFFFFul);
        Py_END_ALLOW_THREADS
    } else {
        crc = crc_of((const unsigned char *)b.buf, b.len, value & 0xFFFFFFFFul);
    }
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(crc & 0xFFFFFFFFul);
}

unsigned long metaq_crc(const unsigned char *p, Py_ssize_t n, unsigned long crc) {
    return crc_of(p, n, crc);
}
