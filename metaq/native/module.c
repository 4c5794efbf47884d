/*
 * metaq._speedups: the broker's put-burst fast path, read gathering, CRC-32 and
 * sync-mode fdatasync in C (optional).
 *
 * Functions, each the exact twin of a pure-Python reference that is used
 * when this module was not built (hypothesis tests in tests/protocol,
 * tests/store and tests/client hold them equal), and a thread for the flusher:
 *
 *   scan_put_ats(...)                              == metaq.timers.burst.scan_put_ats_py (_timerscan.c)
 *   encode_timer_acks(items, start, count, first_id) == metaq.timers.burst.encode_timer_acks_py (same)
 *   scan_puts(buf, pos, end, max_body, max_line[, max_frames])
 *                                                 == metaq.protocol.burst.scan_puts_py
 *   scan_idem_burst(buf, pos, end, max_body, max_line[, max_frames[, owner]])
 *                                                 == metaq.idempotence.burst.scan_idem_burst_py (_idemscan.c)
 *   encode_put_acks(frames, start, count, first_id, partition, first_offset)
 *                                                 == metaq.protocol.burst.encode_put_acks_py
 *   write_run(log, seg_start, rel, ready, src, frames, i, j, topic, partition,
 *             offset, now_ms, first_id, index, unit_at) == metaq.store.batch.write_run_py
 *   gather_records(units, skip, log, seg_start, seg_end, limit, nbytes, verify=False, topic=None, partition=0,
 *                  first=0)
 *                                                 == metaq.store.gather.gather_records_py
 *   check_ranges(units, skip, log, seg_start, seg_end, limit, nbytes, topic=None, partition=0, first=0)
 *                                                 == metaq.store.gather.check_ranges_py
 *   send_ranges(fd, head, log, ranges, pos)       == metaq.server.zerocopy.send_ranges_py
 *   send_each(packets, fds)                       == metaq.mqtt.fanout.send_each_py (at the end of this file)
 *   encode_sub_records(topic, partition, payloads, seq0)
 *                                                 == metaq.protocol.putbatch.encode_sub_records_py
 *   encode_idem_sub_records(topic, partition, payloads, pid, seq0)
 *                                                 == metaq.idempotence.wire.encode_idem_sub_records_py
 *   scan_reply(buf, verify=True)                   == metaq.protocol.message.scan_reply_py
 *   gather_payloads(buf, index, count, base=0)     == metaq.protocol.message.gather_payloads_py
 *   scan_records(buf, pos, end)                   == metaq.store.record.scan_records_py
 *   record_ok(buf, pos, size)                     == metaq.store.record.record_ok_py
 *   scan_log(buf, rel, size, base, max_records)   == metaq.store.recovery_scan.scan_log_py (_recoveryscan.c)
 *   write_units(dst, at, src, src_at, n)          == metaq.store.recovery_scan.write_units_py (_recoveryscan.c)
 *   nonzero_end(buf, start, end)                  == metaq.store.mapped.nonzero_end_py (_recoveryscan.c)
 *   keyed_records(buf, rel, stop, end)            == metaq.keys.index.keyed_records_py (_recoveryscan.c)
 *   mqtt_plain_publishes(buf, pos, v5, max_packet, plans, decided, room, count, nbytes)
 *                                                 == metaq.mqtt.wire.plain_publishes_py
 *   mqtt_burst_frames(staged, largest)            == metaq.mqtt.port.burst_frames_py
 *   mqtt_read_publishes(buf, pos, v5, max_packet, plans, decided, room, count, nbytes)
 *                                                 == metaq.mqtt.wire.read_publishes_py (_mqttturn.c)
 *   mqtt_plain_pubacks(buf, pos, v5, max_packet)  == metaq.mqtt.wire.plain_pubacks_py (_mqttacks.c)
 *   mqtt_split, mqtt_publish_bytes, mqtt_pubacks  == metaq.mqtt.wire's split_py, publish_bytes_py and
 *                                                 encode_pubacks_py (_mqttwire.c)
 *   now_ms()                                     == metaq.server.clock.now_ms_py
 *
 *   crc32(data, value=0)                         == zlib.crc32 (metaq.protocol.checksum uses it)
 *   SyncWorker(notify_fd)                        fdatasync off the GIL (metaq/server/flusher.py;
 *                                                in _syncworker.c)
 *
 * See those docstrings for what they do. CRC-32 (IEEE, reflected, as zlib and
 * Java compute it) comes from Intel's ISA-L when setup.py found it
 * (crc32_gzip_refl: carry-less multiply folding, about 4x zlib's speed here)
 * and from zlib otherwise; CRC32_IMPL says which. Each body's CRC is computed
 * once; the record CRC is the header's CRC combined with it (zlib's
 * crc32_combine_op, with the operator for each body length kept across calls).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <zlib.h>

#include "native.h"
#ifdef METAQ_HAVE_ISAL
#include <isa-l/crc.h>
#define CRC32_IMPL_NAME "isa-l"
#else
#define CRC32_IMPL_NAME "zlib"
#endif

#define INT32_MAX_V 2147483647LL
#define MESSAGE_MAGIC 0xDA7A4D51u
#define PREFIX_SIZE 42 /* total, magic, crc, partition, queue_offset, store_ts, born_ts, topic_len */
#define HEADER_SIZE 20 /* msgLen, checksum, msgId, flag */
#define CRC_START 12
#define UNIT_SIZE 16
#define REPLY_MAX 96 /* "result 200 <len> <opaque>\r\n<msgId> <partition> <offset>": at most 89 bytes */

static unsigned long crc_of(const unsigned char *p, Py_ssize_t n, unsigned long crc) {
#ifdef METAQ_HAVE_ISAL
    return crc32_gzip_refl((uint32_t)crc, p, (uint64_t)n);
#else
    while (n > 0) {
        uInt chunk = n > (1 << 30) ? (1u << 30) : (uInt)n;
        crc = crc32(crc, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return crc;
#endif
}

static const char DIGIT_PAIRS[201] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                                      "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                                      "8081828384858687888990919293949596979899";

/* Decimal digits of v (signed) at p; returns how many bytes were written (at most 20). Two digits per division. */
static int put_decimal(char *p, long long v) {
    char tmp[24];
    int n = 24, len = 0;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    while (u >= 100) {
        unsigned d = (unsigned)(u % 100) * 2;
        u /= 100;
        tmp[--n] = DIGIT_PAIRS[d + 1];
        tmp[--n] = DIGIT_PAIRS[d];
    }
    if (u >= 10) {
        tmp[--n] = DIGIT_PAIRS[u * 2 + 1];
        tmp[--n] = DIGIT_PAIRS[u * 2];
    } else {
        tmp[--n] = (char)('0' + u);
    }
    if (v < 0)
        p[len++] = '-';
    memcpy(p + len, tmp + n, (size_t)(24 - n));
    return len + 24 - n;
}

/* 1..10 decimal digits at *p (before lim) followed by `stop`; advances *p past `stop`. */
static int read_digits(const unsigned char **p, const unsigned char *lim, unsigned char stop, long long *out) {
    const unsigned char *s = *p;
    long long v = 0;
    int n = 0;
    while (s < lim && *s >= '0' && *s <= '9') {
        if (++n > 10)
            return 0;
        v = v * 10 + (*s - '0');
        s++;
    }
    if (n == 0 || s >= lim || *s != stop)
        return 0;
    *p = s + 1;
    *out = v;
    return 1;
}

/* One frame header at q; fills the fields and returns the body start, or NULL if the frame is not taken. */
static const unsigned char *parse_head(const unsigned char *q, const unsigned char *lim, const unsigned char **topic,
                                       Py_ssize_t *tlen, long long *partition, long long *length, long long *flag,
                                       long long *checksum, long long *opaque) {
    const unsigned char *s = q;
    if (lim - s < 4 || memcmp(s, "put ", 4) != 0)
        return NULL;
    s += 4;
    *topic = s;
    while (s < lim && *s >= '!' && *s <= '~')
        s++;
    *tlen = s - *topic;
    if (*tlen == 0 || s >= lim || *s != ' ')
        return NULL;
    s++;
    if (!read_digits(&s, lim, ' ', partition) || !read_digits(&s, lim, ' ', length) ||
        !read_digits(&s, lim, ' ', flag))
        return NULL;
    /* 7 tokens: <checksum> <opaque>; 6 tokens (old clients): <opaque> alone, nothing to verify. */
    const unsigned char *after_flag = s;
    if (lim - s >= 3 && s[0] == '-' && s[1] == '1' && s[2] == ' ') {
        *checksum = -1;
        s += 3;
    } else if (!read_digits(&s, lim, ' ', checksum)) {
        s = after_flag;
        *checksum = -1;
    }
    int negative = 0;
    if (s < lim && *s == '-') {
        negative = 1;
        s++;
    }
    if (!read_digits(&s, lim, '\r', opaque) || s >= lim || *s != '\n')
        return NULL;
    if (negative)
        *opaque = -*opaque;
    return s + 1;
}

/* The index unit's tag hash of data with an attribute block (burst.py _attribute_tag: the CRC of its tags, the
   attribute before its first \x02), or -1 when the block is malformed, holds the idempotent producer's reserved
   properties or a @SYSFLAG (a compressed body, left to the general path, which decompresses it). */
static long attribute_tag(const unsigned char *data, Py_ssize_t n) {
    if (n < 4)
        return -1;
    int32_t alen = (int32_t)(((uint32_t)data[0] << 24) | ((uint32_t)data[1] << 16) | ((uint32_t)data[2] << 8) |
                             data[3]);
    if (alen < 0 || alen > n - 4)
        return -1;
    if (alen >= 10 && (memmem(data + 4, (size_t)alen, "\x02METAQ_PID\x01", 11) != NULL ||
                       memmem(data + 4, (size_t)alen, "\x02METAQ_SEQ\x01", 11) != NULL ||
                       memmem(data + 4, (size_t)alen, "\x02@SYSFLAG\x01", 10) != NULL))
        return -1;
    const unsigned char *sep = memchr(data + 4, 2, (size_t)alen); /* the tags end at the first \x02 (tags.py) */
    return (long)(crc_of(data + 4, sep != NULL ? (Py_ssize_t)(sep - (data + 4)) : alen, 0) & 0x7FFFFFFFul);
}

/* The arguments both burst scanners take, ``(buf, pos, end, max_body, max_line[, max_frames])``: the buffer
   held in *b (released by the caller), the positions checked; -1 with a Python error set otherwise. */
int metaq_scan_args(PyObject *args, Py_buffer *b, Py_ssize_t *pos, Py_ssize_t *end, Py_ssize_t *max_body,
                    Py_ssize_t *max_line, Py_ssize_t *max_frames) {
    PyObject *obj;
    *max_frames = PY_SSIZE_T_MAX;
    if (!PyArg_ParseTuple(args, "Onnnn|n", &obj, pos, end, max_body, max_line, max_frames))
        return -1;
    if (PyObject_GetBuffer(obj, b, PyBUF_SIMPLE) < 0)
        return -1;
    if (*pos < 0 || *pos > *end || *end > b->len) {
        PyErr_Format(PyExc_ValueError, "need 0 <= pos <= end <= %zd", b->len);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

static PyObject *scan_puts(PyObject *self, PyObject *args) {
    Py_ssize_t pos, end, max_body, max_line, max_frames;
    Py_buffer b;
    if (metaq_scan_args(args, &b, &pos, &end, &max_body, &max_line, &max_frames) < 0)
        return NULL;
    PyObject *frames = PyList_New(0);
    PyObject *topic_obj = NULL; /* borrowed from the last frame appended */
    const unsigned char *base = (const unsigned char *)b.buf, *lim = base + end;
    if (frames == NULL)
        goto fail;
    while (PyList_GET_SIZE(frames) < max_frames) {
        const unsigned char *q = base + pos, *topic;
        Py_ssize_t tlen;
        long long partition, length, flag, checksum, opaque;
        const unsigned char *body = parse_head(q, lim, &topic, &tlen, &partition, &length, &flag, &checksum, &opaque);
        if (body == NULL)
            break;
        Py_ssize_t head_end = body - base;
        if (head_end - pos - 2 > max_line || partition > INT32_MAX_V || flag > INT32_MAX_V ||
            checksum > INT32_MAX_V || opaque < -INT32_MAX_V - 1 || opaque > INT32_MAX_V || length > max_body ||
            length > end - head_end)
            break;
        unsigned long crc = crc_of(body, (Py_ssize_t)length, 0);
        if (checksum != -1 && checksum != (long long)(crc & 0x7FFFFFFFul))
            break;
        long tag = (flag & 1) ? attribute_tag(body, (Py_ssize_t)length) : 0;
        if (tag < 0)
            break;
        if (topic_obj == NULL || PyBytes_GET_SIZE(topic_obj) != tlen ||
            memcmp(PyBytes_AS_STRING(topic_obj), topic, tlen) != 0) {
            topic_obj = PyBytes_FromStringAndSize((const char *)topic, tlen);
            if (topic_obj == NULL)
                goto fail;
        } else {
            Py_INCREF(topic_obj);
        }
        int size = (flag & 1) ? 8 : 7;
        PyObject *t = PyTuple_New(size);
        if (t == NULL) {
            Py_DECREF(topic_obj);
            goto fail;
        }
        if (size == 8)
            PyTuple_SET_ITEM(t, 7, PyLong_FromLong(tag));
        PyTuple_SET_ITEM(t, 0, topic_obj); /* steals the reference taken above */
        PyTuple_SET_ITEM(t, 1, PyLong_FromLongLong(partition));
        PyTuple_SET_ITEM(t, 2, PyLong_FromLongLong(flag));
        PyTuple_SET_ITEM(t, 3, PyLong_FromLongLong(opaque));
        PyTuple_SET_ITEM(t, 4, PyLong_FromSsize_t(head_end));
        PyTuple_SET_ITEM(t, 5, PyLong_FromLongLong(length));
        PyTuple_SET_ITEM(t, 6, PyLong_FromUnsignedLong(crc));
        for (int k = 1; k < size; k++) {
            if (PyTuple_GET_ITEM(t, k) == NULL) {
                Py_DECREF(t);
                goto fail;
            }
        }
        int appended = PyList_Append(frames, t);
        Py_DECREF(t);
        if (appended < 0)
            goto fail;
        pos = head_end + (Py_ssize_t)length;
    }
    PyBuffer_Release(&b);
    return Py_BuildValue("(Nn)", frames, pos);
fail:
    Py_XDECREF(frames);
    PyBuffer_Release(&b);
    return NULL;
}

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
   scan_idem_burst's frames); 0 with an exception set on bad input. */
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
        if (start + n > sb->len || unit_at + (count + 1) * UNIT_SIZE > ib->len) {
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
        memcpy(r + hsize, src + start, n);
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

static PyObject *write_run(PyObject *self, PyObject *args) {
    PyObject *log_obj, *src_obj, *frames, *topic_obj, *index_obj;
    long long seg_start, offset, now_ms, first_id;
    Py_ssize_t rel, ready, i, j, unit_at;
    long partition;
    if (!PyArg_ParseTuple(args, "OLnnOOnnSlLLLOn", &log_obj, &seg_start, &rel, &ready, &src_obj, &frames, &i, &j,
                          &topic_obj, &partition, &offset, &now_ms, &first_id, &index_obj, &unit_at))
        return NULL;
    Py_buffer lb, sb, ib;
    if (!metaq_run_buffers(log_obj, src_obj, index_obj, &lb, &sb, &ib))
        return NULL;
    Py_ssize_t count = metaq_write_records(&lb, &sb, &ib, frames, i, j, topic_obj, partition, seg_start, &rel, ready,
                                           offset, now_ms, first_id, unit_at);
    PyBuffer_Release(&ib);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&lb);
    return count < 0 ? NULL : Py_BuildValue("(nn)", count, rel);
}

/* The result 200 replies of a run of stored frames (see encode_put_acks_py): one pass, one bytes object. */
static PyObject *encode_put_acks(PyObject *self, PyObject *args) {
    PyObject *frames;
    Py_ssize_t start, count;
    long long first_id, first_offset;
    long partition;
    if (!PyArg_ParseTuple(args, "OnnLlL", &frames, &start, &count, &first_id, &partition, &first_offset))
        return NULL;
    if (!PyList_Check(frames))
        return PyErr_Format(PyExc_TypeError, "frames must be a list");
    if (count < 0)
        count = 0;
    if (start < 0 || start + count > PyList_GET_SIZE(frames))
        return PyErr_Format(PyExc_IndexError, "frames %zd..%zd of %zd", start, start + count,
                            PyList_GET_SIZE(frames));
    PyObject *result = PyBytes_FromStringAndSize(NULL, count * REPLY_MAX);
    if (result == NULL)
        return NULL;
    char *replies = PyBytes_AS_STRING(result), *w = replies;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *t = PyList_GET_ITEM(frames, start + k);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 7) {
            Py_DECREF(result);
            return PyErr_Format(PyExc_TypeError, "a frame is a tuple from scan_puts or scan_idem_burst");
        }
        long long opaque = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 3));
        if (opaque == -1 && PyErr_Occurred()) {
            Py_DECREF(result);
            return NULL;
        }
        if (opaque < -INT32_MAX_V - 1 || opaque > INT32_MAX_V) { /* keeps a reply within REPLY_MAX */
            Py_DECREF(result);
            return PyErr_Format(PyExc_ValueError, "opaque %lld is not a 32-bit int", opaque);
        }
        char body[64];
        int blen = put_decimal(body, first_id + k);
        body[blen++] = ' ';
        blen += put_decimal(body + blen, partition);
        body[blen++] = ' ';
        blen += put_decimal(body + blen, first_offset + k);
        memcpy(w, "result 200 ", 11);
        w += 11;
        w += put_decimal(w, blen);
        *w++ = ' ';
        w += put_decimal(w, opaque);
        *w++ = '\r';
        *w++ = '\n';
        memcpy(w, body, (size_t)blen);
        w += blen;
    }
    if (_PyBytes_Resize(&result, w - replies) < 0) /* frees it on failure */
        return NULL;
    return result;
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

static PyObject *gather_records(PyObject *self, PyObject *args) {
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
static PyObject *check_ranges(PyObject *self, PyObject *args) {
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

#define SEND_IOV_MAX 1024 /* Linux's IOV_MAX */

/* send_ranges(fd, head, log, ranges, pos) == metaq.server.zerocopy.send_ranges_py: one non-blocking sendmsg (MSG_DONTWAIT,
 * MSG_NOSIGNAL) of ``head`` then the ranges of ``log`` (check_ranges' pairs), from byte ``pos`` of that whole, at
 * most SEND_IOV_MAX pieces; returns the bytes the kernel took. Raises OSError (BlockingIOError when the socket is
 * full). The GIL is released for the call; the buffers are held (exported) until it returns. */
static PyObject *send_ranges(PyObject *self, PyObject *args) {
    int fd;
    PyObject *log_obj;
    Py_buffer hb, rb, lb;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "iy*Oy*n", &fd, &hb, &log_obj, &rb, &pos))
        return NULL;
    if (PyObject_GetBuffer(log_obj, &lb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&hb);
        PyBuffer_Release(&rb);
        return NULL;
    }
    struct iovec iov[SEND_IOV_MAX];
    int n = 0;
    const int64_t *r = (const int64_t *)rb.buf;
    Py_ssize_t nr = rb.len / (Py_ssize_t)(2 * sizeof(int64_t));
    PyObject *err = NULL;
    if (pos < 0)
        pos = 0;
    if (pos < hb.len) {
        iov[n].iov_base = (char *)hb.buf + pos;
        iov[n].iov_len = (size_t)(hb.len - pos);
        n++;
        pos = 0;
    } else {
        pos -= hb.len;
    }
    for (Py_ssize_t k = 0; k < nr && n < SEND_IOV_MAX; k++) {
        int64_t a = r[2 * k], b = r[2 * k + 1];
        if (a < 0 || b < a || b > lb.len) {
            err = PyExc_ValueError;
            break;
        }
        if (pos >= b - a) {
            pos -= b - a;
            continue;
        }
        iov[n].iov_base = (char *)lb.buf + a + pos;
        iov[n].iov_len = (size_t)(b - a - pos);
        pos = 0;
        n++;
    }
    ssize_t sent = 0;
    int saved = 0;
    if (err == NULL && n > 0) {
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)n;
        Py_BEGIN_ALLOW_THREADS
        do {
            sent = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        } while (sent < 0 && errno == EINTR);
        saved = errno;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&lb);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&hb);
    if (err != NULL)
        return PyErr_Format(err, "a range lies outside the buffer");
    if (sent < 0) {
        errno = saved;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(sent);
}

static PyObject *send_each(PyObject *self, PyObject *args); /* at the end of this file */

/* record_ok(buf, pos, size) == metaq.store.record.record_ok_py: one record checked in one call. */
static PyObject *py_record_ok(PyObject *self, PyObject *args) {
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
static PyObject *scan_records(PyObject *self, PyObject *args) {
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

static PyObject *py_crc32(PyObject *self, PyObject *args) {
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

/* A putb body from payloads (see metaq.protocol.putbatch.encode_sub_records_py): one sub-record per payload,
   `put <topic> <partition> <len> 0 <checksum> <seq>\r\n<payload>`, seq counting from seq0; one bytes object.
   With pid >= 0 a putb_idem body (metaq.idempotence.wire.encode_idem_sub_records_py): one put_idem frame per
   payload, `put_idem <topic> <partition> <len> 0 <checksum> <pid> <seq> 0\r\n<payload>`. */
static PyObject *encode_records(Py_buffer *topic, long long partition, PyObject *payloads, long long pid,
                                long long seq0) {
    PyObject *seq = PySequence_Fast(payloads, "payloads must be a sequence of bytes");
    if (seq == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t total = 0, line = 9 + topic->len + 5 * 21 + 2 + 12 + 2;
    for (Py_ssize_t k = 0; k < count; k++) {
        if (!PyBytes_CheckExact(items[k])) {
            Py_DECREF(seq);
            return PyErr_Format(PyExc_TypeError, "payload %zd is %.100s, not bytes", k, Py_TYPE(items[k])->tp_name);
        }
        total += PyBytes_GET_SIZE(items[k]) + line;
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    char *w = PyBytes_AS_STRING(result);
    for (Py_ssize_t k = 0; k < count; k++) {
        const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(items[k]);
        Py_ssize_t n = PyBytes_GET_SIZE(items[k]);
        if (pid >= 0) {
            memcpy(w, "put_idem ", 9);
            w += 9;
        } else {
            memcpy(w, "put ", 4);
            w += 4;
        }
        memcpy(w, topic->buf, topic->len);
        w += topic->len;
        *w++ = ' ';
        w += put_decimal(w, partition);
        *w++ = ' ';
        w += put_decimal(w, n);
        memcpy(w, " 0 ", 3);
        w += 3;
        w += put_decimal(w, (long long)(crc_of(data, n, 0) & 0x7FFFFFFFul));
        *w++ = ' ';
        if (pid >= 0) {
            w += put_decimal(w, pid);
            *w++ = ' ';
        }
        w += put_decimal(w, seq0 + k);
        if (pid >= 0) {
            memcpy(w, " 0", 2);
            w += 2;
        }
        *w++ = '\r';
        *w++ = '\n';
        memcpy(w, data, n);
        w += n;
    }
    Py_DECREF(seq);
    if (_PyBytes_Resize(&result, w - PyBytes_AS_STRING(result)) < 0)
        return NULL;
    return result;
}

static PyObject *encode_sub_records(PyObject *self, PyObject *args) {
    Py_buffer topic;
    long long partition, seq0;
    PyObject *payloads;
    if (!PyArg_ParseTuple(args, "y*LOL", &topic, &partition, &payloads, &seq0))
        return NULL;
    PyObject *result = encode_records(&topic, partition, payloads, -1, seq0);
    PyBuffer_Release(&topic);
    return result;
}

/* A putb_idem body from payloads (see metaq.idempotence.wire.encode_idem_sub_records_py): one put_idem frame per
   payload, `put_idem <topic> <partition> <len> 0 <checksum> <pid> <seq> 0\r\n<payload>`, seq counting from seq0;
   one bytes object. Numbers are C long longs: OverflowError past 64 bits, or when seq0's count runs past it. */
static PyObject *encode_idem_sub_records(PyObject *self, PyObject *args) {
    Py_buffer topic;
    long long partition, pid, seq0;
    PyObject *payloads;
    if (!PyArg_ParseTuple(args, "y*LOLL", &topic, &partition, &payloads, &pid, &seq0))
        return NULL;
    if (pid < 0) {
        PyBuffer_Release(&topic);
        return PyErr_Format(PyExc_ValueError, "producer id %lld < 0", pid);
    }
    Py_ssize_t count = PyObject_Length(payloads);
    if (count < 0) {
        PyBuffer_Release(&topic);
        return NULL;
    }
    if (count > 0 && seq0 > LLONG_MAX - (long long)(count - 1)) {
        PyBuffer_Release(&topic);
        return PyErr_Format(PyExc_OverflowError, "sequences %lld.. of %zd payloads run past 2**63-1", seq0, count);
    }
    PyObject *result = encode_records(&topic, partition, payloads, pid, seq0);
    PyBuffer_Release(&topic);
    return result;
}

/* A get reply's records in one pass (see metaq.protocol.message.scan_reply_py): for each whole record, six
   native int64s (msg_id, flag, attribute start, attribute end, payload start, payload end) packed in one bytes
   object; the walk stops at a cut-off final record, or at a fault named in the result's 4th item. */
static PyObject *scan_reply(PyObject *self, PyObject *args) {
    Py_buffer b;
    int verify = 1;
    if (!PyArg_ParseTuple(args, "y*|p", &b, &verify))
        return NULL;
    const unsigned char *buf = (const unsigned char *)b.buf;
    Py_ssize_t size = b.len, pos = 0, count = 0;
    PyObject *index = PyBytes_FromStringAndSize(NULL, (size / 20 + 1) * 6 * (Py_ssize_t)sizeof(int64_t));
    if (index == NULL) {
        PyBuffer_Release(&b);
        return NULL;
    }
    int64_t *w = (int64_t *)PyBytes_AS_STRING(index);
    PyObject *fault = NULL;
    while (size - pos >= 20) {
        const unsigned char *h = buf + pos;
        int32_t msg_len = (int32_t)(((uint32_t)h[0] << 24) | ((uint32_t)h[1] << 16) | ((uint32_t)h[2] << 8) | h[3]);
        int32_t checksum = (int32_t)(((uint32_t)h[4] << 24) | ((uint32_t)h[5] << 16) | ((uint32_t)h[6] << 8) | h[7]);
        uint64_t id = 0;
        for (int k = 8; k < 16; k++)
            id = (id << 8) | h[k];
        int32_t flag = (int32_t)(((uint32_t)h[16] << 24) | ((uint32_t)h[17] << 16) | ((uint32_t)h[18] << 8) | h[19]);
        if (msg_len < 0) {
            fault = Py_BuildValue("(snl)", "length", pos, (long)msg_len);
            break;
        }
        Py_ssize_t start = pos + 20, end = start + msg_len;
        if (end > size)
            break;
        if (verify) {
            long long actual = (long long)(crc_of(buf + start, msg_len, 0) & 0x7FFFFFFFul);
            if (actual != checksum) {
                fault = Py_BuildValue("(snlL)", "checksum", pos, (long)checksum, actual);
                break;
            }
        }
        int64_t attr_start = -1, attr_end = -1, payload_start = start;
        if (flag & 1) {
            if (msg_len < 4) {
                attr_start = attr_end = -2;
            } else {
                int32_t attr_len = (int32_t)(((uint32_t)buf[start] << 24) | ((uint32_t)buf[start + 1] << 16) |
                                             ((uint32_t)buf[start + 2] << 8) | buf[start + 3]);
                if (attr_len < 0 || (Py_ssize_t)attr_len + 4 > msg_len) {
                    attr_start = attr_end = -2;
                } else {
                    attr_start = start + 4;
                    attr_end = payload_start = start + 4 + attr_len;
                }
            }
        }
        w[0] = (int64_t)id;
        w[1] = flag;
        w[2] = attr_start;
        w[3] = attr_end;
        w[4] = payload_start;
        w[5] = end;
        w += 6;
        count++;
        pos = end;
    }
    PyBuffer_Release(&b);
    if (fault == NULL && PyErr_Occurred()) {
        Py_DECREF(index);
        return NULL;
    }
    if (_PyBytes_Resize(&index, count * 6 * (Py_ssize_t)sizeof(int64_t)) < 0) {
        Py_XDECREF(fault);
        return NULL;
    }
    if (fault == NULL) {
        fault = Py_None;
        Py_INCREF(fault);
    }
    return Py_BuildValue("(NnnN)", index, count, pos, fault);
}

/* The payloads a scan_reply index names, gathered for an Arrow binary column (see
   metaq.protocol.message.gather_payloads_py): (offsets, data), offsets ``count + 1`` native int32s starting at
   ``base`` (the payloads' running ends), data the payloads back to back. ValueError for an index that does not fit
   the buffer or a column past 2 GiB. */
static PyObject *gather_payloads(PyObject *self, PyObject *args) {
    Py_buffer b, ix;
    Py_ssize_t count;
    long long base = 0;
    if (!PyArg_ParseTuple(args, "y*y*n|L", &b, &ix, &count, &base))
        return NULL;
    PyObject *offsets = NULL, *data = NULL;
    const int64_t *q = (const int64_t *)ix.buf;
    Py_ssize_t total = 0;
    if (count < 0 || ix.len < count * 6 * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "gather_payloads: the index holds fewer records than count");
        goto done;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        int64_t s = q[6 * k + 4], e = q[6 * k + 5];
        if (s < 0 || e < s || e > b.len) {
            PyErr_Format(PyExc_ValueError, "gather_payloads: record %zd's payload %lld..%lld is outside the %zd-byte "
                         "reply", k, (long long)s, (long long)e, b.len);
            goto done;
        }
        total += (Py_ssize_t)(e - s);
    }
    if (base < 0 || base + (long long)total > INT32_MAX_V) {
        PyErr_SetString(PyExc_ValueError, "gather_payloads: the column would pass 2 GiB (int32 offsets)");
        goto done;
    }
    offsets = PyBytes_FromStringAndSize(NULL, (count + 1) * (Py_ssize_t)sizeof(int32_t));
    data = PyBytes_FromStringAndSize(NULL, total);
    if (offsets == NULL || data == NULL)
        goto done;
    int32_t *o = (int32_t *)PyBytes_AS_STRING(offsets);
    char *d = PyBytes_AS_STRING(data);
    const char *src = (const char *)b.buf;
    long long at = base;
    o[0] = (int32_t)at;
    for (Py_ssize_t k = 0; k < count; k++) {
        int64_t s = q[6 * k + 4], e = q[6 * k + 5];
        memcpy(d, src + s, (size_t)(e - s));
        d += e - s;
        at += e - s;
        o[k + 1] = (int32_t)at;
    }
done:
    PyBuffer_Release(&b);
    PyBuffer_Release(&ix);
    if (PyErr_Occurred()) {
        Py_XDECREF(offsets);
        Py_XDECREF(data);
        return NULL;
    }
    return Py_BuildValue("(NN)", offsets, data);
}

unsigned long metaq_crc(const unsigned char *p, Py_ssize_t n, unsigned long crc) {
    return crc_of(p, n, crc);
}

int metaq_decimal(char *p, long long v) {
    return put_decimal(p, v);
}

static PyObject *mqtt_burst_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs); /* at the end */

/* now_ms() == metaq.server.clock.now_ms_py: milliseconds since the Unix epoch (CLOCK_REALTIME, what time.time
   reads), an int; the stamp of every burst, read once a turn. */
static PyObject *now_ms(PyObject *self, PyObject *unused) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

static PyMethodDef methods[] = {
    {"crc32", py_crc32, METH_VARARGS, "crc32(data, value=0) -> the unsigned CRC-32 of data (as zlib.crc32)"},
    {"scan_puts", scan_puts, METH_VARARGS,
     "scan_puts(buf, pos, end, max_body, max_line, max_frames=no limit) -> (frames, next_pos)"},
    {"scan_idem_burst", scan_idem_burst, METH_VARARGS,
     "scan_idem_burst(buf, pos, end, max_body, max_line, max_frames=no limit, owner=None) -> (frames, data, next_pos)"},
    {"scan_put_ats", scan_put_ats, METH_VARARGS,
     "scan_put_ats(buf, pos, end, max_body, max_frames, now_ms, timer_topic, entry_type, max_name, max_ahead_ms)"
     " -> (items, src, next_pos)"},
    {"encode_timer_acks", encode_timer_acks, METH_VARARGS,
     "encode_timer_acks(items, start, count, first_id) -> the result 200 replies of taken put_ats, joined"},
    {"now_ms", now_ms, METH_NOARGS, "now_ms() -> milliseconds since the Unix epoch: metaq.server.clock.now_ms_py"},
    {"write_run", write_run, METH_VARARGS,
     "write_run(log, seg_start, rel, ready, src, frames, i, j, topic, partition, offset, now_ms, first_id, index, "
     "unit_at) -> (count, rel_after)"},
    {"encode_sub_records", encode_sub_records, METH_VARARGS,
     "encode_sub_records(topic, partition, payloads, seq0) -> a putb body: one sub-record per payload"},
    {"encode_idem_sub_records", encode_idem_sub_records, METH_VARARGS,
     "encode_idem_sub_records(topic, partition, payloads, pid, seq0) -> a putb_idem body: a put_idem frame each"},
    {"scan_reply", scan_reply, METH_VARARGS,
     "scan_reply(buf, verify=True) -> (index, count, stop, fault): a get reply's records, six int64s each"},
    {"gather_payloads", gather_payloads, METH_VARARGS,
     "gather_payloads(buf, index, count, base=0) -> (offsets, data): an Arrow binary column's int32 offsets and data"},
    {"encode_put_acks", encode_put_acks, METH_VARARGS,
     "encode_put_acks(frames, start, count, first_id, partition, first_offset) -> the result 200 replies, joined"},
    {"record_ok", py_record_ok, METH_VARARGS,
     "record_ok(buf, pos, size) -> True when a valid record of exactly size bytes starts at pos"},
    {"scan_records", scan_records, METH_VARARGS,
     "scan_records(buf, pos, end) -> (where the run of valid records from pos stops, how many records it holds)"},
    {"gather_records", gather_records, METH_VARARGS,
     "gather_records(units, skip, log, seg_start, seg_end, limit, nbytes, verify=False, topic=None, partition=0, "
     "first=0) -> (count, data, stop)"},
    {"check_ranges", check_ranges, METH_VARARGS,
     "check_ranges(units, skip, log, seg_start, seg_end, limit, nbytes, topic=None, partition=0, first=0) -> "
     "(count, ranges, their bytes, stop)"},
    {"send_ranges", send_ranges, METH_VARARGS,
     "send_ranges(fd, head, log, ranges, pos) -> bytes sent by one non-blocking sendmsg"},
    {"send_each", send_each, METH_VARARGS,
     "send_each(packets, fds) -> [(i, bytes taken or -errno)] of the fds that did not take all of the packets"},
    {"scan_log", scan_log, METH_VARARGS,
     "scan_log(buf, rel, size, base, max_records) -> (stop, count, max_msg_id, units, runs): recovery's scan"},
    {"write_units", write_units, METH_VARARGS,
     "write_units(dst, at, src, src_at, n) -> how many of the n index units at dst[at:] differed (rewritten)"},
    {"nonzero_end", nonzero_end, METH_VARARGS,
     "nonzero_end(buf, start, end) -> one past the last non-zero byte of buf[start:end], or start if none"},
    {"keyed_records", keyed_records, METH_VARARGS,
     "keyed_records(buf, rel, stop, end) -> (where the walk stopped, [rel of each record with attributes])"},
    {"mqtt_plain_publishes", (PyCFunction)(void (*)(void))mqtt_plain_publishes, METH_FASTCALL,
     "mqtt_plain_publishes(buf, pos, v5, max_packet, plans, decided, room, count, nbytes) -> (entries, pos, "
     "qos1, nbytes)"},
    {"mqtt_read_publishes", (PyCFunction)(void (*)(void))mqtt_read_publishes, METH_FASTCALL,
     "mqtt_read_publishes(buf, pos, v5, max_packet, plans, decided, room, count, nbytes) -> (entries, pos, "
     "qos1, nbytes, pubacks): mqtt_plain_publishes and the PUBACKs of the QoS 1 ones (_mqttturn.c)"},
    {"mqtt_plain_pubacks", mqtt_plain_pubacks, METH_VARARGS,
     "mqtt_plain_pubacks(buf, pos, v5, max_packet) -> ([packet ids], next pos): a read's plain PUBACKs (_mqttacks.c)"},
    {"mqtt_split", (PyCFunction)(void (*)(void))mqtt_split, METH_FASTCALL,
     "mqtt_split(buf, pos, max_packet, version, names) -> (fields, a, b): the next MQTT packet's bounds, a plain "
     "PUBLISH's or PUBACK's fields decoded (_mqttwire.c)"},
    {"mqtt_publish_bytes", mqtt_publish_bytes, METH_VARARGS,
     "mqtt_publish_bytes(first, topic, packet_id, props, payload) -> an encoded PUBLISH (_mqttwire.c)"},
    {"mqtt_pubacks", mqtt_pubacks, METH_O, "mqtt_pubacks(packet_ids) -> the successful PUBACKs, joined (_mqttwire.c)"},
    {"mqtt_burst_frames", (PyCFunction)(void (*)(void))mqtt_burst_frames, METH_FASTCALL,
     "mqtt_burst_frames(staged, largest) -> (frames, src, general, names): the store's burst frames of staged puts"},
    {"encode_fields", encode_fields, METH_VARARGS,
     "encode_fields(fields) -> protobuf bytes of (field number, value, ...) pairs (rmq5.messagebytes)"},
    {"pop_handle", (PyCFunction)(void (*)(void))pop_handle, METH_FASTCALL,
     "pop_handle(partition, offset, attempt, deadline_ms) -> a receipt handle's text (_pophandles.c)"},
    {"pop_parse_handles", pop_parse_handles, METH_O,
     "pop_parse_handles(handles) -> (partition, offset, attempt, deadline_ms) or None a handle (_pophandles.c)"},
#ifdef METAQ_HAVE_OPENSSL
    {"served_record", (PyCFunction)(void (*)(void))served_record, METH_FASTCALL,
     "served_record(data, flag, topic, queue_id, queue_offset, born_ms, store_ms, msg_id, endpoint, served, context) "
     "-> a served message's response bytes, None, or its unknown born host's text (_servedmsg.c; rmq5.messagebytes)"},
#endif
    {"grpc_frames", grpc_frames, METH_O,
     "grpc_frames(items) -> the gRPC messages items, each length-prefixed, joined (_pbwrite.c; rmq5.wire)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "metaq._speedups",
                                    "The put-burst fast path in C (optional; see metaq.protocol.burst).", -1, methods};

PyMODINIT_FUNC PyInit__speedups(void) {
    if (PyType_Ready(&SyncWorkerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SyncWorkerType);
    if (PyModule_AddStringConstant(m, "CRC32_IMPL", CRC32_IMPL_NAME) < 0 ||
        PyModule_AddObject(m, "SyncWorker", (PyObject *)&SyncWorkerType) < 0) {
        Py_DECREF(&SyncWorkerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

/* ==== send_each: one packet run to many sockets (the MQTT fan-out reader) ==================================== */

/* send_each(packets, fds) == metaq.mqtt.fanout.send_each_py: ``packets`` (a sequence of bytes-like objects,
 * at most SEND_IOV_MAX) written in order by one non-blocking sendmsg (MSG_DONTWAIT | MSG_NOSIGNAL, EINTR retried)
 * to each file descriptor of ``fds`` (a sequence of ints), one after the other, none waited for. Returns
 * ``[(i, n), ...]`` for each ``fds[i]`` that did not take all of it, in order: ``n`` the bytes it took (0 when its
 * buffer was full: EAGAIN), or ``-errno`` when the send failed; ``[]`` when every socket took everything. The GIL is
 * released for the sends; the buffers are held (exported) until they end. */
static PyObject *send_each(PyObject *self, PyObject *args) {
    PyObject *packets_obj, *fds_obj;
    if (!PyArg_ParseTuple(args, "OO", &packets_obj, &fds_obj))
        return NULL;
    PyObject *packets = PySequence_Fast(packets_obj, "send_each: packets must be a sequence of buffers");
    if (packets == NULL)
        return NULL;
    PyObject *fdseq = PySequence_Fast(fds_obj, "send_each: fds must be a sequence of ints");
    if (fdseq == NULL) {
        Py_DECREF(packets);
        return NULL;
    }
    Py_ssize_t np = PySequence_Fast_GET_SIZE(packets), nf = PySequence_Fast_GET_SIZE(fdseq);
    PyObject *result = NULL;
    Py_buffer *bufs = NULL;
    int *fds = NULL;
    ssize_t *took = NULL;
    int *errs = NULL;
    Py_ssize_t held = 0;
    struct iovec iov[SEND_IOV_MAX];
    size_t total = 0;
    if (np > SEND_IOV_MAX) {
        PyErr_Format(PyExc_ValueError, "send_each: %zd packets, at most %d", np, SEND_IOV_MAX);
        goto done;
    }
    bufs = PyMem_Calloc(np ? (size_t)np : 1, sizeof(Py_buffer));
    fds = PyMem_Malloc((nf ? (size_t)nf : 1) * sizeof(int));
    took = PyMem_Malloc((nf ? (size_t)nf : 1) * sizeof(ssize_t));
    errs = PyMem_Malloc((nf ? (size_t)nf : 1) * sizeof(int));
    if (bufs == NULL || fds == NULL || took == NULL || errs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < np; k++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(packets, k), &bufs[k], PyBUF_SIMPLE) < 0)
            goto done;
        held++;
        iov[k].iov_base = bufs[k].buf;
        iov[k].iov_len = (size_t)bufs[k].len;
        total += (size_t)bufs[k].len;
    }
    for (Py_ssize_t i = 0; i < nf; i++) {
        long fd = PyLong_AsLong(PySequence_Fast_GET_ITEM(fdseq, i));
        if (fd == -1 && PyErr_Occurred())
            goto done;
        if (fd < 0 || fd > INT32_MAX_V) {
            PyErr_Format(PyExc_ValueError, "send_each: bad file descriptor %ld", fd);
            goto done;
        }
        fds[i] = (int)fd;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < nf; i++) {
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)np;
        ssize_t sent;
        do {
            sent = sendmsg(fds[i], &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        } while (sent < 0 && errno == EINTR);
        took[i] = sent;
        errs[i] = sent < 0 ? errno : 0;
    }
    Py_END_ALLOW_THREADS
    result = PyList_New(0);
    if (result == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < nf; i++) {
        long long n;
        if (took[i] >= 0) {
            if ((size_t)took[i] == total)
                continue;
            n = (long long)took[i];
        } else {
            n = (errs[i] == EAGAIN || errs[i] == EWOULDBLOCK) ? 0 : -(long long)errs[i];
        }
        PyObject *item = Py_BuildValue("(nL)", i, n);
        if (item == NULL || PyList_Append(result, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(result);
            goto done;
        }
        Py_DECREF(item);
    }
done:
    for (Py_ssize_t k = 0; k < held; k++)
        PyBuffer_Release(&bufs[k]);
    PyMem_Free(bufs);
    PyMem_Free(fds);
    PyMem_Free(took);
    PyMem_Free(errs);
    Py_DECREF(fdseq);
    Py_DECREF(packets);
    return result;
}

/* ==== end of send_each ======================================================================================= */

/* ======================================================================================================== */
/* MQTT: the plain PUBLISHes of a reader's buffer, split and staged in one call                               */
/* ======================================================================================================== */

/* mqtt_plain_publishes(buf, pos, v5, max_packet, plans, decided, room, count, nbytes)
   -> (entries, next pos, how many at QoS 1, their records' bytes):
   metaq.mqtt.wire.plain_publishes_py in C (see its docstring; the tests hold the two equal). Each entry is the plain
   values (metaq topic, hash % partitions, flag, prefix + payload, name, payload, qos, dup, packet id or None). */
int metaq_publishes_args(PyObject *const *args, Py_ssize_t nargs, metaq_publishes_in *in) {
    if (!metaq_nargs(nargs, 9) || PyObject_GetBuffer(args[0], &in->b, PyBUF_SIMPLE) < 0)
        return 0;
    if (metaq_arg_ssize(args[1], &in->pos) && (in->v5 = PyObject_IsTrue(args[2])) >= 0 &&
        metaq_arg_ll(args[3], &in->max_packet) && metaq_arg_type(5, args[4], &PyDict_Type) &&
        metaq_arg_type(6, args[5], &PyDict_Type) && metaq_arg_ll(args[6], &in->room) &&
        metaq_arg_ssize(args[7], &in->count) && metaq_arg_ll(args[8], &in->nbytes)) {
        in->plans = args[4];
        in->decided = args[5];
        return 1;
    }
    PyBuffer_Release(&in->b);
    return 0;
}

PyObject *metaq_plain_split(metaq_publishes_in *in, Py_ssize_t *qos1_out, Py_ssize_t *taken_out) {
    Py_ssize_t pos = in->pos, count = in->count, qos1 = 0, taken = 0;
    long long max_packet = in->max_packet, room = in->room, nbytes = in->nbytes;
    int v5 = in->v5;
    PyObject *plans = in->plans, *decided = in->decided;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    const unsigned char *buf = (const unsigned char *)in->b.buf;
    Py_ssize_t end = in->b.len;
    if (pos < 0 || pos > end) {
        PyErr_Format(PyExc_ValueError, "mqtt_plain_publishes: pos %zd is outside the %zd-byte buffer", pos, end);
        goto fail;
    }
    while (count > 0 && nbytes > 0 && end - pos >= 2) {
        unsigned char first = buf[pos];
        if (first != 0x30 && first != 0x32 && first != 0x3A) /* PUBLISH, QoS 0 or 1 (DUP at 1 only), not retained */
            break;
        long long length = 0;
        int shift = 0, i = 1, bad = 0;
        unsigned char c;
        for (;;) {
            if (pos + i >= end) {
                bad = 1;
                break;
            }
            c = buf[pos + i];
            length |= (long long)(c & 0x7F) << shift;
            if (!(c & 0x80))
                break;
            if (i == 4) {
                bad = 1;
                break;
            }
            shift += 7;
            i++;
        }
        if (bad || (i > 1 && !c))
            break;
        long long total = 1 + i + length;
        if (total > max_packet || total > (long long)(end - pos))
            break;
        Py_ssize_t start = pos + 1 + i, stop = pos + (Py_ssize_t)total;
        if (stop - start < 2)
            break;
        Py_ssize_t at = start + 2 + (((Py_ssize_t)buf[start] << 8) | buf[start + 1]);
        if (at > stop)
            break;
        PyObject *key = PyBytes_FromStringAndSize((const char *)buf + start + 2, at - start - 2);
        if (key == NULL)
            goto fail;
        PyObject *plan = PyDict_GetItemWithError(plans, key); /* borrowed */
        Py_DECREF(key);
        if (plan == NULL) {
            if (PyErr_Occurred())
                goto fail;
            break;
        }
        if (!PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != 6) {
            PyErr_SetString(PyExc_TypeError, "mqtt_plain_publishes: a plan is not a tuple of 6");
            goto fail;
        }
        int qos = (first >> 1) & 1;
        long packet_id = 0;
        if (qos) {
            if (room <= 0 || at + 2 > stop)
                break;
            packet_id = ((long)buf[at] << 8) | buf[at + 1];
            if (!packet_id)
                break;
            at += 2;
        }
        if (v5) {
            if (at >= stop || buf[at])
                break;
            at += 1;
        }
        PyObject *name = PyTuple_GET_ITEM(plan, 0), *topic = PyTuple_GET_ITEM(plan, 1);
        PyObject *hash = PyTuple_GET_ITEM(plan, 2), *flag = PyTuple_GET_ITEM(plan, 3);
        PyObject *prefix = PyTuple_GET_ITEM(plan, 4 + qos);
        PyObject *partitions = PyDict_GetItemWithError(decided, topic); /* borrowed */
        if (partitions == NULL) {
            if (PyErr_Occurred())
                goto fail;
            break;
        }
        long long nparts = PyLong_AsLongLong(partitions);
        if (nparts == -1 && PyErr_Occurred())
            goto fail;
        if (nparts <= 0)
            break;
        unsigned long long crc = PyLong_AsUnsignedLongLong(hash);
        if (crc == (unsigned long long)-1 && PyErr_Occurred())
            goto fail;
        if (!PyBytes_CheckExact(prefix)) {
            PyErr_SetString(PyExc_TypeError, "mqtt_plain_publishes: a plan's record prefix is not bytes");
            goto fail;
        }
        Py_ssize_t plen = PyBytes_GET_SIZE(prefix), n = stop - at;
        PyObject *data = PyBytes_FromStringAndSize(NULL, plen + n);
        if (data != NULL) {
            memcpy(PyBytes_AS_STRING(data), PyBytes_AS_STRING(prefix), plen);
            memcpy(PyBytes_AS_STRING(data) + plen, buf + at, n);
        }
        /* the plan's items, borrowed, stay alive: no Python code runs while the fields are made */
        PyObject *fields[9] = {Py_NewRef(topic), PyLong_FromUnsignedLongLong(crc % (unsigned long long)nparts),
                               Py_NewRef(flag), data, Py_NewRef(name),
                               PyBytes_FromStringAndSize((const char *)buf + at, n), PyLong_FromLong(qos),
                               Py_NewRef((first & 0x08) ? Py_True : Py_False),
                               qos ? PyLong_FromLong(packet_id) : Py_NewRef(Py_None)};
        PyObject *entry = metaq_tuple_of(9, fields);
        if (entry == NULL)
            goto fail;
        int added = PyList_Append(out, entry);
        Py_DECREF(entry);
        if (added < 0)
            goto fail;
        pos = stop;
        count--;
        nbytes -= plen + n;
        taken += plen + n;
        room -= qos;
        qos1 += qos;
    }
    in->pos = pos;
    *qos1_out = qos1;
    *taken_out = taken;
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* A tuple of n new references, stolen (NULL ones too: then none is kept and NULL is returned). */
PyObject *metaq_tuple_of(Py_ssize_t n, PyObject **items) {
    PyObject *t = NULL;
    int bad = 0;
    for (Py_ssize_t k = 0; k < n; k++)
        bad |= items[k] == NULL;
    if (!bad)
        t = PyTuple_New(n);
    for (Py_ssize_t k = 0; k < n; k++) {
        if (t != NULL)
            PyTuple_SET_ITEM(t, k, items[k]);
        else
            Py_XDECREF(items[k]);
    }
    return t;
}

PyObject *mqtt_plain_publishes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    metaq_publishes_in in;
    Py_ssize_t qos1, taken;
    if (!metaq_publishes_args(args, nargs, &in))
        return NULL;
    PyObject *out = metaq_plain_split(&in, &qos1, &taken);
    PyBuffer_Release(&in.b);
    if (out == NULL)
        return NULL;
    PyObject *items[4] = {out, PyLong_FromSsize_t(in.pos), PyLong_FromSsize_t(qos1), PyLong_FromSsize_t(taken)};
    return metaq_tuple_of(4, items);
}

/* mqtt_burst_frames(staged, largest) -> (frames, src, general, names): metaq.mqtt.port.burst_frames_py in C (see its
   docstring; the tests hold the two equal): a frame (topic bytes, partition, flag, 0, start, length, CRC-32) per
   staged entry over src, their data back to back. */
static PyObject *mqtt_burst_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long largest;
    if (!metaq_nargs(nargs, 2) || !metaq_arg_ll(args[1], &largest))
        return NULL;
    PyObject *staged = args[0];
    PyObject *seq = PySequence_Fast(staged, "staged must be a sequence of entries");
    if (seq == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq), total = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *names = PyDict_New(), *frames = PyList_New(count), *general = PyList_New(0), *src = NULL;
    if (names == NULL || frames == NULL || general == NULL)
        goto fail;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *e = items[k];
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) < 4) {
            PyErr_Format(PyExc_TypeError, "mqtt_burst_frames: entry %zd is not a tuple of at least 4", k);
            goto fail;
        }
        PyObject *data = PyTuple_GET_ITEM(e, 3);
        if (!PyBytes_Check(data)) {
            PyErr_Format(PyExc_TypeError, "mqtt_burst_frames: entry %zd's data is %.100s, not bytes", k,
                         Py_TYPE(data)->tp_name);
            goto fail;
        }
        total += PyBytes_GET_SIZE(data);
    }
    src = PyBytes_FromStringAndSize(NULL, total);
    if (src == NULL)
        goto fail;
    char *w = PyBytes_AS_STRING(src);
    Py_ssize_t at = 0;
    PyObject *last_topic = NULL, *last_tb = NULL; /* borrowed: a burst is mostly one topic */
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *e = items[k];
        PyObject *topic = PyTuple_GET_ITEM(e, 0), *data = PyTuple_GET_ITEM(e, 3), *tb;
        if (topic == last_topic) {
            tb = last_tb;
        } else {
            tb = PyDict_GetItemWithError(names, topic);
            if (tb == NULL) {
                if (PyErr_Occurred())
                    goto fail;
                if (!PyUnicode_Check(topic)) {
                    PyErr_Format(PyExc_TypeError, "mqtt_burst_frames: entry %zd's topic is %.100s, not str", k,
                                 Py_TYPE(topic)->tp_name);
                    goto fail;
                }
                PyObject *made = PyUnicode_AsASCIIString(topic);
                if (made == NULL)
                    goto fail;
                int bad = PyDict_SetItem(names, topic, made) < 0;
                Py_DECREF(made); /* the dict holds it */
                if (bad)
                    goto fail;
                tb = made;
            }
            if (!PyBytes_Check(tb)) {
                PyErr_SetString(PyExc_TypeError, "mqtt_burst_frames: a topic's encoding is not bytes");
                goto fail;
            }
            last_topic = topic;
            last_tb = tb;
        }
        Py_ssize_t n = PyBytes_GET_SIZE(data);
        if ((long long)n + (long long)PyBytes_GET_SIZE(tb) > largest) {
            PyObject *ix = PyLong_FromSsize_t(k);
            int bad = ix == NULL || PyList_Append(general, ix) < 0;
            Py_XDECREF(ix);
            if (bad)
                goto fail;
        }
        const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(data);
        PyObject *fields[7] = {Py_NewRef(tb), Py_NewRef(PyTuple_GET_ITEM(e, 1)), Py_NewRef(PyTuple_GET_ITEM(e, 2)),
                               PyLong_FromLong(0), PyLong_FromSsize_t(at), PyLong_FromSsize_t(n),
                               PyLong_FromUnsignedLong(crc_of(d, n, 0) & 0xFFFFFFFFul)};
        PyObject *frame = metaq_tuple_of(7, fields);
        if (frame == NULL)
            goto fail;
        PyList_SET_ITEM(frames, k, frame);
        memcpy(w + at, d, n);
        at += n;
    }
    Py_DECREF(seq);
    PyObject *out[4] = {frames, src, general, names};
    return metaq_tuple_of(4, out);
fail:
    Py_DECREF(seq);
    Py_XDECREF(names);
    Py_XDECREF(frames);
    Py_XDECREF(general);
    Py_XDECREF(src);
    return NULL;
}
