/*
 * metaq.native._bytes.scan_put_ats: the twin of metaq.timers.burst.scan_put_ats_py (see its docstring;
 * tests/timers/test_burst.py holds the two equal).
 *
 * A put_at frame is taken when its header is exactly
 *   put_at <topic> <partition> <len> 0 <checksum> @<epoch ms>|+<delay ms> <opaque>\r\n
 * as timers.burst._LINE matches it (topic [!-~]{1,255}; partition and len 1-10 digits; flag the one digit 0;
 * checksum -1 or 1-10 digits; when @ or + and 1-19 digits; opaque -?1-10 digits), its numbers are in range, its
 * topic at most max_name bytes, its body whole and its checksum right, and its delivery time at most max_ahead ms
 * after now. Each is encoded as its ENTRY record (timers.records.ENTRY ">4sBBHiiiqq", the topic, the body).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "native.h"

#define I32_MAX 2147483647LL
#define ENTRY_HEAD 36 /* ">4sBBHiiiqq" */

static void be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void be64(unsigned char *p, uint64_t v) {
    be32(p, (uint32_t)(v >> 32));
    be32(p + 4, (uint32_t)v);
}

/* One frame's fields, or 0 when the frame is not taken. */
struct put_at {
    const unsigned char *topic, *body;
    Py_ssize_t tlen, length;
    long long partition, checksum, opaque, due;
    unsigned long crc;
};

static int parse_put_at(const unsigned char *s, const unsigned char *lim, Py_ssize_t max_body, Py_ssize_t max_name,
                        long long now, long long max_ahead, struct put_at *f) {
    unsigned long long partition, length, checksum, when, opaque;
    if (lim - s < 7 || memcmp(s, "put_at ", 7) != 0)
        return 0;
    s += 7;
    f->topic = s;
    while (s < lim && *s >= '!' && *s <= '~' && s - f->topic <= 255)
        s++;
    f->tlen = s - f->topic;
    if (f->tlen == 0 || f->tlen > 255 || s >= lim || *s != ' ')
        return 0;
    s++;
    if (!metaq_digits(&s, lim, 10, ' ', &partition) || !metaq_digits(&s, lim, 10, ' ', &length))
        return 0;
    if (lim - s < 2 || s[0] != '0' || s[1] != ' ')
        return 0;
    s += 2;
    if (lim - s >= 3 && s[0] == '-' && s[1] == '1' && s[2] == ' ') {
        checksum = (unsigned long long)-1;
        s += 3;
    } else if (!metaq_digits(&s, lim, 10, ' ', &checksum)) {
        return 0;
    }
    if (s >= lim || (*s != '@' && *s != '+'))
        return 0;
    int absolute = *s == '@';
    s++;
    if (!metaq_digits(&s, lim, 19, ' ', &when))
        return 0;
    int negative = s < lim && *s == '-';
    if (negative)
        s++;
    if (!metaq_digits(&s, lim, 10, '\r', &opaque) || s >= lim || *s != '\n')
        return 0;
    s++;
    f->partition = (long long)partition;
    f->checksum = checksum == (unsigned long long)-1 ? -1 : (long long)checksum;
    f->opaque = negative ? -(long long)opaque : (long long)opaque;
    if (partition > I32_MAX || (f->checksum != -1 && f->checksum > I32_MAX) || f->opaque > I32_MAX ||
        f->opaque < -I32_MAX - 1 || (long long)length > max_body || (long long)length > lim - s ||
        f->tlen > max_name)
        return 0;
    f->body = s;
    f->length = (Py_ssize_t)length;
    f->crc = metaq_crc(s, f->length, 0);
    if (f->checksum != -1 && f->checksum != (long long)(f->crc & 0x7FFFFFFFul))
        return 0;
    if (absolute) {
        if (when > (unsigned long long)(now + max_ahead))
            return 0;
        f->due = (long long)when;
    } else {
        if (when > (unsigned long long)max_ahead)
            return 0;
        f->due = now + (long long)when;
    }
    if (f->due < now)
        f->due = now;
    return 1;
}

/* The ENTRY record's 36-byte head (timers.records.ENTRY: magic, version, kind, topic length, partition, flag 0,
   checksum, due, born) at r; kind OWNED (4) when the entry holds its owner after the topic, else ENTRY (1). */
static void entry_head(unsigned char *r, const struct put_at *f, long long now, int owned) {
    memcpy(r, "MQTM", 4);
    r[4] = 1; /* VERSION */
    r[5] = owned ? 4 : 1; /* KIND_OWNED, KIND_ENTRY */
    r[6] = (unsigned char)(f->tlen >> 8);
    r[7] = (unsigned char)f->tlen;
    be32(r + 8, (uint32_t)f->partition);
    be32(r + 12, 0);
    be32(r + 16, (uint32_t)(f->crc & 0x7FFFFFFFul));
    be64(r + 20, (uint64_t)f->due);
    be64(r + 28, (uint64_t)now);
}

/* entry_type((topic, partition, 0, checksum, due, now, body, owner)) as tuple.__new__ makes it: entry_type is tuple
 * or a subclass of it whose instances are its eight fields (a NamedTuple such as TimerEntry, whose generated
 * __new__ is tuple.__new__(cls, fields)). Tuple's tp_new builds it, whatever the Python version needs of it (such as
 * 3.14's hash cache); nothing of entry_type is read and no Python runs. */
static PyObject *new_entry(PyObject *entry_type, PyObject *topic, long long partition, long long checksum,
                           long long due, long long now, PyObject *body, PyObject *owner) {
    PyObject *fields = Py_BuildValue("(OLiLLLOO)", topic, partition, 0, checksum, due, now, body, owner);
    if (fields == NULL)
        return NULL;
    PyObject *args = PyTuple_Pack(1, fields);
    Py_DECREF(fields);
    if (args == NULL)
        return NULL;
    PyObject *entry = PyTuple_Type.tp_new((PyTypeObject *)entry_type, args, NULL);
    Py_DECREF(args);
    return entry;
}

PyObject *scan_put_ats(PyObject *self, PyObject *args) {
    PyObject *obj, *timer_topic, *entry_type, *owner;
    Py_ssize_t pos, end, max_body, max_frames, max_name, olen;
    long long now, max_ahead;
    const char *ofield;
    /* ofield: timers.records.owner_field(owner) (its length byte, then the name), empty for no owner; owner: the
       name (str) or None, as the entries hold it. */
    if (!PyArg_ParseTuple(args, "OnnnnLSOnLy#O", &obj, &pos, &end, &max_body, &max_frames, &now, &timer_topic,
                          &entry_type, &max_name, &max_ahead, &ofield, &olen, &owner))
        return NULL;
    if (now < 0 || max_ahead < 0 || max_name < 0)
        return PyErr_Format(PyExc_ValueError, "now_ms, max_ahead and max_name must not be negative");
    if (olen != 0 && (olen < 2 || (unsigned char)ofield[0] != olen - 1))
        return PyErr_Format(PyExc_ValueError, "the owner field must be its length byte and the name");
    int owned = olen > 0;
    if (!PyType_Check(entry_type) || !PyType_IsSubtype((PyTypeObject *)entry_type, &PyTuple_Type))
        return PyErr_Format(PyExc_TypeError, "entry_type is tuple or a NamedTuple of eight fields, not %.100s",
                            Py_TYPE(entry_type)->tp_name);
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    if (pos < 0 || end > b.len || pos > end) {
        PyBuffer_Release(&b);
        return PyErr_Format(PyExc_ValueError, "pos %zd and end %zd do not fit a buffer of %zd", pos, end, b.len);
    }
    const unsigned char *base = (const unsigned char *)b.buf, *lim = base + end;
    PyObject *items = PyList_New(0), *src = NULL, *result = NULL;
    Py_ssize_t total = 0, start = pos;
    struct put_at f;
    unsigned char head[ENTRY_HEAD];
    if (items == NULL)
        goto done;
    /* First pass: the frames taken, each one's item; the records' size. */
    while (pos < end && PyList_GET_SIZE(items) < max_frames) {
        if (!parse_put_at(base + pos, lim, max_body, max_name, now, max_ahead, &f))
            break;
        Py_ssize_t elen = ENTRY_HEAD + f.tlen + olen + f.length;
        entry_head(head, &f, now, owned);
        unsigned long crc = metaq_crc(head, ENTRY_HEAD, 0);
        crc = metaq_crc(f.topic, f.tlen, crc);
        if (owned)
            crc = metaq_crc((const unsigned char *)ofield, olen, crc);
        crc = metaq_crc(f.body, f.length, crc) & 0xFFFFFFFFul;
        PyObject *topic = PyUnicode_DecodeASCII((const char *)f.topic, f.tlen, NULL);
        PyObject *body = PyBytes_FromStringAndSize((const char *)f.body, f.length);
        PyObject *entry = NULL, *item = NULL;
        if (topic != NULL && body != NULL)
            entry = new_entry(entry_type, topic, f.partition, (long long)(f.crc & 0x7FFFFFFFul), f.due, now, body, owner);
        Py_XDECREF(body);
        if (entry != NULL) /* N: the item takes these references, also when it cannot be built */
            item = Py_BuildValue("(NLLnn(OiiLnnk)N)", topic, f.partition, f.opaque,
                                 (Py_ssize_t)(f.body - base) + f.length, f.length, timer_topic, 0, 0, f.opaque, total,
                                 elen, crc, entry);
        else
            Py_XDECREF(topic);
        if (item == NULL)
            goto done;
        int appended = PyList_Append(items, item);
        Py_DECREF(item);
        if (appended < 0)
            goto done;
        total += elen;
        pos = (Py_ssize_t)(f.body - base) + f.length;
    }
    /* Second pass: the records, end to end. */
    src = PyBytes_FromStringAndSize(NULL, total);
    if (src == NULL)
        goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(src);
    Py_ssize_t n = PyList_GET_SIZE(items), at = 0, p = start;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (!parse_put_at(base + p, lim, max_body, max_name, now, max_ahead, &f)) {
            PyErr_SetString(PyExc_RuntimeError, "scan_put_ats: a frame changed between the passes");
            goto done;
        }
        entry_head(out + at, &f, now, owned);
        memcpy(out + at + ENTRY_HEAD, f.topic, (size_t)f.tlen);
        if (owned)
            memcpy(out + at + ENTRY_HEAD + f.tlen, ofield, (size_t)olen);
        memcpy(out + at + ENTRY_HEAD + f.tlen + olen, f.body, (size_t)f.length);
        at += ENTRY_HEAD + f.tlen + olen + f.length;
        p = (Py_ssize_t)(f.body - base) + f.length;
    }
    result = Py_BuildValue("(OOn)", items, src, pos);
done:
    Py_XDECREF(items);
    Py_XDECREF(src);
    PyBuffer_Release(&b);
    return result;
}

/* The result 200 replies of a run of taken put_ats (see encode_timer_acks_py): one pass, one bytes object. */
#define TIMER_REPLY_MAX 96 /* "result 200 <len> <opaque>\r\n<msgId> <partition> -1": at most 80 bytes */

PyObject *encode_timer_acks(PyObject *self, PyObject *args) {
    PyObject *items;
    Py_ssize_t start, count;
    long long first_id;
    if (!PyArg_ParseTuple(args, "OnnL", &items, &start, &count, &first_id))
        return NULL;
    if (!PyList_Check(items))
        return PyErr_Format(PyExc_TypeError, "items must be a list");
    if (count < 0)
        count = 0;
    if (start < 0 || start > PyList_GET_SIZE(items) || count > PyList_GET_SIZE(items) - start)
        return PyErr_Format(PyExc_IndexError, "items from %zd, %zd of them, of %zd", start, count,
                            PyList_GET_SIZE(items));
    if (first_id < 0 || (count > 0 && first_id > LLONG_MAX - ((long long)count - 1)))
        return PyErr_Format(PyExc_OverflowError, "message ids from %lld, %zd of them, are not all int64", first_id,
                            count);
    PyObject *result = PyBytes_FromStringAndSize(NULL, count * TIMER_REPLY_MAX);
    if (result == NULL)
        return NULL;
    char *replies = PyBytes_AS_STRING(result), *w = replies;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *t = PyList_GET_ITEM(items, start + k);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 3) {
            Py_DECREF(result);
            return PyErr_Format(PyExc_TypeError, "an item is a tuple from scan_put_ats");
        }
        PyObject *p = PyTuple_GET_ITEM(t, 1), *o = PyTuple_GET_ITEM(t, 2);
        if (!PyLong_CheckExact(p) || !PyLong_CheckExact(o)) { /* no __index__: no Python runs while t is borrowed */
            Py_DECREF(result);
            return PyErr_Format(PyExc_TypeError, "an item's partition and opaque are ints");
        }
        long long partition = PyLong_AsLongLong(p);
        long long opaque = partition == -1 && PyErr_Occurred() ? -1 : PyLong_AsLongLong(o);
        if (PyErr_Occurred()) {
            Py_DECREF(result);
            return NULL;
        }
        char body[64];
        int blen = snprintf(body, sizeof body, "%lld %lld -1", first_id + (long long)k, partition);
        w += snprintf(w, TIMER_REPLY_MAX, "result 200 %d %lld\r\n%s", blen, opaque, body);
    }
    if (_PyBytes_Resize(&result, w - replies) < 0)
        return NULL;
    return result;
}
