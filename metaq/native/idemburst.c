/*
 * metaq.native._bytes.scan_idem_burst: the twin of metaq.idempotence.burst.scan_idem_burst_py (see its docstring;
 * tests/idempotence/test_burst.py holds the two equal).
 *
 * A put_idem frame is taken when its header is exactly
 *   put_idem <topic> <partition> <len> <flag> <checksum> <pid> <seq> <opaque>\r\n
 * as idempotence.burst._FRAME matches it (topic [!-~]+; partition and len 1-10 digits; flag -?1-10 digits;
 * checksum -1 or 1-10 digits; pid and seq 1-19 digits; opaque -?1-11 digits), its numbers are in range, its
 * body is whole and its checksum right, and its data takes the identity (with_identity: a well-formed
 * attribute block without the reserved properties). The stored data goes into one new bytes object.
 * An optional last argument, the owner (bytes, or None), is appended after the identity as METAQ_OWNER.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "native.h"

#define I32_MAX 2147483647LL
#define I63_MAX 9223372036854775807ULL
#define IDENT_MAX 96 /* "\x02@FLAG\x01<flag>\x02METAQ_PID\x01<pid>\x02METAQ_SEQ\x01<seq>\x02": at most 84 bytes */
#define OWNER_MAX 256 /* the owner's bytes at most (a user name is 128 at most: metaq.auth.acl) */

static const char PID_MARK[] = "\x02METAQ_PID\x01";
static const char SEQ_MARK[] = "\x02METAQ_SEQ\x01";
static const char OWNER_MARK[] = "\x02METAQ_OWNER\x01";
static const char SYSFLAG_MARK[] = "\x02@SYSFLAG\x01"; /* may mark a compressed body: the general path's */

/* 1..max decimal digits at *p, then `stop`; the value in *out (no overflow: max <= 19). Shared: native.h. */
int metaq_digits(const unsigned char **p, const unsigned char *lim, int max, unsigned char stop,
                  unsigned long long *out) {
    const unsigned char *s = *p;
    unsigned long long v = 0;
    int n = 0;
    while (s < lim && *s >= '0' && *s <= '9') {
        if (++n > max)
            return 0;
        v = v * 10 + (unsigned long long)(*s - '0');
        s++;
    }
    if (n == 0 || s >= lim || *s != stop)
        return 0;
    *p = s + 1;
    *out = v;
    return 1;
}

/* An optionally negative number of 1..max digits followed by `stop`. */
static int signed_digits(const unsigned char **p, const unsigned char *lim, int max, unsigned char stop,
                         long long *out) {
    int negative = *p < lim && **p == '-';
    const unsigned char *s = *p + negative;
    unsigned long long v;
    if (!metaq_digits(&s, lim, max, stop, &v))
        return 0;
    *p = s;
    *out = negative ? -(long long)v : (long long)v;
    return 1;
}

typedef struct {
    const unsigned char *topic;
    Py_ssize_t tlen, body, length;
    long long partition, flag, checksum, opaque;
    unsigned long long pid, seq;
} Head;

/* The header at q; the body's start (an offset from base), or -1 when the frame is not taken. */
static Py_ssize_t parse_idem_head(const unsigned char *base, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t max_line,
                                  Head *h) {
    const unsigned char *s = base + pos, *lim = base + end;
    unsigned long long v;
    if (lim - s < 9 || memcmp(s, "put_idem ", 9) != 0)
        return -1;
    s += 9;
    h->topic = s;
    while (s < lim && *s >= '!' && *s <= '~')
        s++;
    h->tlen = s - h->topic;
    if (h->tlen == 0 || s >= lim || *s != ' ')
        return -1;
    s++;
    if (!metaq_digits(&s, lim, 10, ' ', &v))
        return -1;
    h->partition = (long long)v;
    if (!metaq_digits(&s, lim, 10, ' ', &v))
        return -1;
    h->length = (Py_ssize_t)v;
    if (!signed_digits(&s, lim, 10, ' ', &h->flag))
        return -1;
    if (lim - s >= 3 && s[0] == '-' && s[1] == '1' && s[2] == ' ') {
        h->checksum = -1;
        s += 3;
    } else if (metaq_digits(&s, lim, 10, ' ', &v)) {
        h->checksum = (long long)v;
    } else {
        return -1;
    }
    if (!metaq_digits(&s, lim, 19, ' ', &h->pid) || !metaq_digits(&s, lim, 19, ' ', &h->seq) ||
        !signed_digits(&s, lim, 11, '\r', &h->opaque) || s >= lim || *s != '\n')
        return -1;
    Py_ssize_t body = (s + 1) - base;
    if (body - pos - 2 > max_line || h->partition > I32_MAX || h->checksum > I32_MAX || h->pid < 1 ||
        h->pid > I63_MAX || h->seq > I63_MAX || h->flag < -I32_MAX - 1 || h->flag > I32_MAX ||
        h->opaque < -I32_MAX - 1 || h->opaque > I32_MAX)
        return -1;
    h->body = body;
    return body;
}

static int contains(const unsigned char *p, Py_ssize_t n, const char *needle) {
    size_t k = strlen(needle);
    return n >= (Py_ssize_t)k && memmem(p, (size_t)n, needle, k) != NULL;
}

/* The identity's bytes for a put with this attribute (with_identity's `ident`); its length. */
static int identity_bytes(char *w, const Head *h, const unsigned char *attr, Py_ssize_t alen, const char *owner,
                          Py_ssize_t olen) {
    char *start = w;
    int has_sep = memchr(attr, 2, (size_t)alen) != NULL;
    if (!(h->flag & 1) || !has_sep) { /* no properties yet: the separator, and the MetaQ flag as @FLAG */
        *w++ = 2;
        if (h->flag != 0) {
            memcpy(w, "@FLAG\x01", 6);
            w += 6;
            w += metaq_decimal(w, h->flag);
            *w++ = 2;
        }
    } else if (attr[alen - 1] != 2) {
        *w++ = 2;
    }
    memcpy(w, "METAQ_PID\x01", 10);
    w += 10;
    w += metaq_decimal(w, (long long)h->pid);
    memcpy(w, "\x02METAQ_SEQ\x01", 11);
    w += 11;
    w += metaq_decimal(w, (long long)h->seq);
    *w++ = 2;
    if (owner != NULL) {
        memcpy(w, "METAQ_OWNER\x01", 12);
        w += 12;
        memcpy(w, owner, (size_t)olen);
        w += olen;
        *w++ = 2;
    }
    return (int)(w - start);
}

static int grow(PyObject **out, Py_ssize_t *cap, Py_ssize_t need) {
    if (need <= *cap)
        return 0;
    Py_ssize_t cap2 = *cap * 2 > need ? *cap * 2 : need;
    if (_PyBytes_Resize(out, cap2) < 0)
        return -1;
    *cap = cap2;
    return 0;
}

PyObject *scan_idem_burst(PyObject *self, PyObject *args) {
    Py_ssize_t pos, end, max_body, max_line, max_frames = PY_SSIZE_T_MAX, olen = 0;
    Py_buffer b;
    PyObject *obj;
    const char *owner = NULL;
    if (!PyArg_ParseTuple(args, "Onnnn|nz#", &obj, &pos, &end, &max_body, &max_line, &max_frames, &owner, &olen))
        return NULL;
    if (olen > OWNER_MAX) {
        PyErr_Format(PyExc_ValueError, "owner longer than %d bytes", OWNER_MAX);
        return NULL;
    }
    if (PyObject_GetBuffer(obj, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    if (pos < 0 || pos > end || end > b.len) {
        PyErr_Format(PyExc_ValueError, "need 0 <= pos <= end <= %zd", b.len);
        PyBuffer_Release(&b);
        return NULL;
    }
    Py_ssize_t cap = 4096, used = 0;
    PyObject *frames = PyList_New(0), *out = PyBytes_FromStringAndSize(NULL, cap), *topic_obj = NULL;
    const unsigned char *base = (const unsigned char *)b.buf;
    if (frames == NULL || out == NULL)
        goto fail;
    while (PyList_GET_SIZE(frames) < max_frames) {
        Head h;
        if (parse_idem_head(base, pos, end, max_line, &h) < 0 || h.length > max_body || h.length > end - h.body)
            break;
        const unsigned char *body = base + h.body;
        unsigned long crc = metaq_crc(body, h.length, 0);
        if (h.checksum != -1 && h.checksum != (long long)(crc & 0x7FFFFFFFul))
            break;
        Py_ssize_t alen = 0, skip = 0; /* the attribute's length, and the bytes of the put's data before its payload */
        if (h.flag & 1) {
            if (h.length < 4)
                break;
            alen = (Py_ssize_t)(int32_t)(((uint32_t)body[0] << 24) | ((uint32_t)body[1] << 16) |
                                         ((uint32_t)body[2] << 8) | body[3]);
            if (alen < 0 || alen > h.length - 4 || contains(body + 4, alen, PID_MARK) ||
                contains(body + 4, alen, SEQ_MARK) || contains(body + 4, alen, SYSFLAG_MARK) ||
                contains(body + 4, alen, OWNER_MARK))
                break;
            skip = 4 + alen;
        }
        const unsigned char *attr = body + 4;
        char ident[IDENT_MAX + OWNER_MAX + 16];
        int ilen = identity_bytes(ident, &h, attr, alen, owner, olen);
        Py_ssize_t n = 4 + alen + ilen + (h.length - skip);
        if (grow(&out, &cap, used + n) < 0)
            goto fail;
        unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out) + used;
        uint32_t new_alen = (uint32_t)(alen + ilen);
        w[0] = (unsigned char)(new_alen >> 24);
        w[1] = (unsigned char)(new_alen >> 16);
        w[2] = (unsigned char)(new_alen >> 8);
        w[3] = (unsigned char)new_alen;
        if (alen)
            memcpy(w + 4, attr, (size_t)alen);
        memcpy(w + 4 + alen, ident, (size_t)ilen);
        memcpy(w + 4 + alen + ilen, body + skip, (size_t)(h.length - skip));
        /* the tags (tags.py): the put's attribute up to its first \x02; the identity starts with one when it has none */
        const unsigned char *sep = alen ? memchr(attr, 2, (size_t)alen) : NULL;
        unsigned long tag = metaq_crc(w + 4, sep != NULL ? (Py_ssize_t)(sep - attr) : alen, 0) & 0x7FFFFFFFul;
        unsigned long data_crc = metaq_crc(w, n, 0);
        if (topic_obj == NULL || PyBytes_GET_SIZE(topic_obj) != h.tlen ||
            memcmp(PyBytes_AS_STRING(topic_obj), h.topic, (size_t)h.tlen) != 0) {
            topic_obj = PyBytes_FromStringAndSize((const char *)h.topic, h.tlen);
            if (topic_obj == NULL)
                goto fail;
        } else {
            Py_INCREF(topic_obj);
        }
        PyObject *t = PyTuple_New(12);
        if (t == NULL) {
            Py_DECREF(topic_obj);
            goto fail;
        }
        PyTuple_SET_ITEM(t, 0, topic_obj); /* steals the reference taken above */
        PyTuple_SET_ITEM(t, 1, PyLong_FromLongLong(h.partition));
        PyTuple_SET_ITEM(t, 2, PyLong_FromLongLong(h.flag | 1));
        PyTuple_SET_ITEM(t, 3, PyLong_FromLongLong(h.opaque));
        PyTuple_SET_ITEM(t, 4, PyLong_FromSsize_t(used));
        PyTuple_SET_ITEM(t, 5, PyLong_FromSsize_t(n));
        PyTuple_SET_ITEM(t, 6, PyLong_FromUnsignedLong(data_crc));
        PyTuple_SET_ITEM(t, 7, PyLong_FromUnsignedLong(tag));
        PyTuple_SET_ITEM(t, 8, PyLong_FromUnsignedLongLong(h.pid));
        PyTuple_SET_ITEM(t, 9, PyLong_FromUnsignedLongLong(h.seq));
        PyTuple_SET_ITEM(t, 10, PyLong_FromSsize_t(h.length));
        PyTuple_SET_ITEM(t, 11, PyLong_FromSsize_t(h.body + h.length));
        for (int k = 1; k < 12; k++) {
            if (PyTuple_GET_ITEM(t, k) == NULL) {
                Py_DECREF(t);
                goto fail;
            }
        }
        int appended = PyList_Append(frames, t);
        Py_DECREF(t);
        if (appended < 0)
            goto fail;
        used += n;
        pos = h.body + h.length;
    }
    PyBuffer_Release(&b);
    if (_PyBytes_Resize(&out, used) < 0) {
        Py_DECREF(frames);
        return NULL;
    }
    return Py_BuildValue("(NNn)", frames, out, pos);
fail:
    Py_XDECREF(frames);
    Py_XDECREF(out);
    PyBuffer_Release(&b);
    return NULL;
}
