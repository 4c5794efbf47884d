/*
 * metaq.native._bytes.served_record: metaq.rmq5.messagebytes.served_record_py in C (see its docstring; the tests run
 * each case against both). A served RocketMQ 5 message's response bytes (a ReceiveMessageResponse's or
 * PullMessageResponse's field 2, the Message) written straight from a log record a RocketMQ or gRPC producer wrote,
 * in one pass over its properties; None for any record it leaves to the general mapping (the Python definition's
 * docstring says which); the born host's text when the context's hosts do not know it yet. Built only with OpenSSL's
 * libcrypto, which digests the body (without it the Python definition serves); a record whose MD5 libcrypto cannot
 * give (a FIPS-only configuration) is left to the general mapping.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "native.h"
#ifdef METAQ_HAVE_OPENSSL
#include <openssl/err.h>
#include <openssl/evp.h>

/* The names the pass looks for: the first item of the context (messagebytes._CONTEXT), in this order. The context:
   (names, untrimmed characters, most user properties, reserved names, hosts, longest born host text). */
enum { N_UNIQ, N_KEYS, N_TAGS, N_GROUP, N_DELIVER, N_BORNHOST, N_SYSFLAG, N_NAMES };
/* The most user properties the context may let the pass sort out itself (repeats are looked for among them). */
#define USER_CAP 256
/* protobuf's Timestamp range, in seconds. */
#define TS_MIN_S (-62135596800LL)
#define TS_MAX_S 253402300799LL
/* apache.rocketmq.v2's DigestType MD5, Encoding IDENTITY, MessageType NORMAL, FIFO, DELAY. */
#define DIGEST_MD5 2
#define ENCODING_IDENTITY 1
#define TYPE_NORMAL 1
#define TYPE_FIFO 2
#define TYPE_DELAY 3

typedef struct {
    const char *p;
    Py_ssize_t n;
} span;

typedef struct {
    unsigned char *p;
    Py_ssize_t len, cap;
} growable;

static Py_ssize_t vsize(uint64_t v) {
    Py_ssize_t n = 1;
    while (v > 0x7F) {
        v >>= 7;
        n++;
    }
    return n;
}

static int grow(growable *g, Py_ssize_t more) {
    if (g->len + more <= g->cap)
        return 0;
    Py_ssize_t cap = (g->len + more) * 2 + 64;
    unsigned char *p = PyMem_Realloc(g->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    g->p = p;
    g->cap = cap;
    return 0;
}

static void put_v(growable *g, uint64_t v) { /* room already made */
    while (v > 0x7F) {
        g->p[g->len++] = (unsigned char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    g->p[g->len++] = (unsigned char)v;
}

static int int_field(growable *g, unsigned field, uint64_t v) {
    if (grow(g, 20) < 0)
        return -1;
    put_v(g, (uint64_t)field << 3);
    put_v(g, v);
    return 0;
}

static int bytes_field(growable *g, unsigned field, const void *p, Py_ssize_t n) {
    if (grow(g, n + 20) < 0)
        return -1;
    put_v(g, (uint64_t)field << 3 | 2);
    put_v(g, (uint64_t)n);
    memcpy(g->p + g->len, p, (size_t)n);
    g->len += n;
    return 0;
}

static int str_field(growable *g, unsigned field, PyObject *s) {
    Py_ssize_t n;
    const char *p = PyUnicode_AsUTF8AndSize(s, &n);
    return p == NULL ? -1 : bytes_field(g, field, p, n);
}

/* A Timestamp's or Duration's (seconds, nanos) of ms milliseconds, floored as Python's divmod. */
static void split_ms(long long ms, long long *seconds, long long *nanos) {
    long long s = ms / 1000, r = ms % 1000;
    if (r < 0) {
        r += 1000;
        s -= 1;
    }
    *seconds = s;
    *nanos = r * 1000000;
}

static int time_field(growable *g, unsigned field, long long ms) {
    long long s, ns;
    split_ms(ms, &s, &ns);
    Py_ssize_t inner = (s ? 1 + vsize((uint64_t)s) : 0) + (ns ? 1 + vsize((uint64_t)ns) : 0);
    if (grow(g, inner + 20) < 0)
        return -1;
    put_v(g, (uint64_t)field << 3 | 2);
    put_v(g, (uint64_t)inner);
    if (s) {
        put_v(g, 1 << 3);
        put_v(g, (uint64_t)s);
    }
    if (ns) {
        put_v(g, 2 << 3);
        put_v(g, (uint64_t)ns);
    }
    return 0;
}

static int in_range(long long ms) {
    long long s, ns;
    split_ms(ms, &s, &ns);
    return s >= TS_MIN_S && s <= TS_MAX_S;
}

static int is_name(span key, PyObject *names, int which) {
    PyObject *name = PyTuple_GET_ITEM(names, which);
    return key.n == PyBytes_GET_SIZE(name) && memcmp(key.p, PyBytes_AS_STRING(name), (size_t)key.n) == 0;
}

static int same(span a, span b) { return a.n == b.n && memcmp(a.p, b.p, (size_t)a.n) == 0; }

/* The user properties' names seen so far, by hash (open addressing): a repeated name is found in one probe or a
   few, not by comparing it with every name before it (a producer chooses how many repeats a record holds). */
#define USER_SLOTS 512 /* a power of two, at least twice USER_CAP */
_Static_assert(USER_SLOTS >= 2 * USER_CAP && (USER_SLOTS & (USER_SLOTS - 1)) == 0, "USER_SLOTS");
typedef struct {
    int16_t at[USER_SLOTS]; /* an index into the names, -1 for an empty slot */
    int ready;
} user_table;

static uint32_t span_hash(span s) { /* FNV-1a */
    uint32_t h = 2166136261u;
    for (Py_ssize_t i = 0; i < s.n; i++)
        h = (h ^ (unsigned char)s.p[i]) * 16777619u;
    return h;
}

/* The slot holding key among names[], or the empty slot where it goes. */
static Py_ssize_t user_slot(user_table *t, const span *names, span key) {
    if (!t->ready) {
        memset(t->at, 0xFF, sizeof t->at);
        t->ready = 1;
    }
    Py_ssize_t h = (Py_ssize_t)(span_hash(key) & (USER_SLOTS - 1));
    while (t->at[h] >= 0 && !same(names[t->at[h]], key))
        h = (h + 1) & (USER_SLOTS - 1);
    return h;
}

static int ascii(const char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if ((unsigned char)p[i] >= 0x80)
            return 0;
    return 1;
}

/* A new str of a span known to be valid UTF-8. */
static PyObject *text(span s) { return PyUnicode_DecodeUTF8(s.p, s.n, "strict"); }

/* 0 when o is a str, else -1 with a TypeError naming what it is. */
static int require_text(PyObject *o, const char *what) {
    if (PyUnicode_Check(o))
        return 0;
    PyErr_Format(PyExc_TypeError, "%s is text", what);
    return -1;
}

/* MD5 from OpenSSL's libcrypto, fetched once, and one digest context reused (the GIL is held); none where the
   library has no MD5 (a FIPS-only configuration). */
static EVP_MD *md5_md;
static EVP_MD_CTX *md5_ctx;
static int md5_tried;

/* The MD5 digest of p[0:n] in upper-case hex into out (32 bytes): 1, or 0 when libcrypto cannot give it. */
static int md5_upper_hex(const char *p, Py_ssize_t n, unsigned char *out) {
    static const char hex[] = "0123456789ABCDEF";
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (!md5_tried) {
        md5_tried = 1;
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
        md5_md = EVP_MD_fetch(NULL, "MD5", NULL);
#else
        md5_md = (EVP_MD *)EVP_md5();
#endif
        md5_ctx = md5_md != NULL ? EVP_MD_CTX_new() : NULL;
    }
    if (md5_ctx == NULL || !EVP_DigestInit_ex(md5_ctx, md5_md, NULL) || !EVP_DigestUpdate(md5_ctx, p, (size_t)n) ||
        !EVP_DigestFinal_ex(md5_ctx, md, &len) || len != 16) {
        ERR_clear_error(); /* none of ours left in the thread's queue, where Python's ssl and hashlib read theirs */
        return 0;
    }
    for (int i = 0; i < 16; i++) {
        out[2 * i] = (unsigned char)hex[md[i] >> 4];
        out[2 * i + 1] = (unsigned char)hex[md[i] & 15];
    }
    return 1;
}

/* The message id of a message whose client gave none, "%X" % msg_id (its metaq id in upper-case hex), as system
   property 3: an int of 64 bits written here, anything else formatted as Python formats it. */
static int id_field(growable *sys, PyObject *msg_id) {
    static const char hex[] = "0123456789ABCDEF";
    if (PyLong_CheckExact(msg_id)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(msg_id, &overflow);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (!overflow) {
            char buf[17], *p = buf + sizeof buf;
            unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
            do {
                *--p = hex[u & 15];
                u >>= 4;
            } while (u);
            if (v < 0)
                *--p = '-';
            return bytes_field(sys, 3, p, buf + sizeof buf - p);
        }
    }
    PyObject *fmt = PyUnicode_FromString("%X");
    if (fmt == NULL)
        return -1;
    PyObject *id = PyUnicode_Format(fmt, msg_id);
    Py_DECREF(fmt);
    int r = id == NULL ? -1 : str_field(sys, 3, id);
    Py_XDECREF(id);
    return r;
}

/* The body's digest (DigestType MD5, its upper-case hex) as system property 4: 1, or 0 when libcrypto cannot give
   it, -1 with an error set. */
static int digest_field(growable *sys, const char *body, Py_ssize_t body_n) {
    if (grow(sys, 32 + 30) < 0)
        return -1;
    if (!md5_upper_hex(body, body_n, sys->p + sys->len + 6)) /* after the 6 bytes of tags and lengths below */
        return 0;
    put_v(sys, 4 << 3 | 2);
    put_v(sys, 2 + 2 + 32);
    put_v(sys, 1 << 3);
    put_v(sys, DIGEST_MD5);
    put_v(sys, 2 << 3 | 2);
    put_v(sys, 32);
    sys->len += 32;
    return 1;
}

/* How many characters the valid UTF-8 of s holds, counted up to one more than most. */
static Py_ssize_t chars_past(span s, Py_ssize_t most) {
    Py_ssize_t n = 0;
    if (s.n <= most)
        return s.n; /* no more characters than bytes */
    for (Py_ssize_t i = 0; i < s.n && n <= most; i++)
        n += ((unsigned char)s.p[i] & 0xC0) != 0x80;
    return n;
}

/* The message's bytes into g: 1 when written, 0 for a record left to the general mapping, 2 when the born host's text
   is not among the context's hosts (*unknown: that text, a new reference), -1 with an error set. */
static int served(growable *g, const char *data, Py_ssize_t size, long long flag, PyObject *topic,
                  long long queue_id, long long queue_offset, long long born_ms, long long store_ms, PyObject *msg_id,
                  PyObject *endpoint, PyObject *handle, long long attempt, long long invisible_ms, PyObject *ctx,
                  PyObject **unknown) {
    PyObject *names = PyTuple_GET_ITEM(ctx, 0), *reserved = PyTuple_GET_ITEM(ctx, 3), *hosts = PyTuple_GET_ITEM(ctx, 4);
    Py_ssize_t room = PyLong_AsSsize_t(PyTuple_GET_ITEM(ctx, 1)), user_max = PyLong_AsSsize_t(PyTuple_GET_ITEM(ctx, 2));
    Py_ssize_t born_max = PyLong_AsSsize_t(PyTuple_GET_ITEM(ctx, 5));
    if ((room == -1 || user_max == -1 || born_max == -1) && PyErr_Occurred())
        return -1;
    if (user_max < 0 || user_max > USER_CAP) {
        PyErr_Format(PyExc_ValueError, "served_record: at most %d user properties", USER_CAP);
        return -1;
    }
    if (!(flag & 1) || size < 4)
        return 0;
    int32_t alen = (int32_t)((uint32_t)(unsigned char)data[0] << 24 | (uint32_t)(unsigned char)data[1] << 16 |
                             (uint32_t)(unsigned char)data[2] << 8 | (uint32_t)(unsigned char)data[3]);
    if (alen < 0 || (Py_ssize_t)alen > size - 4 || (Py_ssize_t)alen + 6 > room)
        return 0;
    const char *attr = data + 4, *end = attr + alen;
    if (!ascii(attr, alen)) { /* valid UTF-8, or left to the general mapping's replacement characters */
        PyObject *check = PyUnicode_DecodeUTF8(attr, alen, "strict");
        if (check == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                return -1;
            PyErr_Clear();
            return 0;
        }
        Py_DECREF(check);
    }
    const char *sep = memchr(attr, '\x02', (size_t)alen);
    if (sep == NULL)
        return 0;
    span tags = {attr, sep - attr}, none = {NULL, -1};
    span uniq = none, keys = none, tag = none, group = none, deliver = none, born = none;
    span user_k[USER_CAP], user_v[USER_CAP];
    user_table seen;
    seen.ready = 0;
    Py_ssize_t users = 0;
    const char *p = sep + 1;
    while (p <= end) {
        const char *stop = memchr(p, '\x02', (size_t)(end - p));
        if (stop == NULL)
            stop = end;
        const char *eq = memchr(p, '\x01', (size_t)(stop - p));
        span key = {p, eq ? eq - p : 0}, value = {eq ? eq + 1 : NULL, eq ? stop - eq - 1 : 0};
        p = stop + 1;
        if (eq == NULL || key.n == 0 || value.n == 0)
            continue;
        if (is_name(key, names, N_UNIQ))
            uniq = value;
        else if (is_name(key, names, N_KEYS))
            keys = value;
        else if (is_name(key, names, N_TAGS))
            tag = value;
        else if (is_name(key, names, N_GROUP))
            group = value;
        else if (is_name(key, names, N_DELIVER))
            deliver = value;
        else if (key.p[0] == '@') {
            if (is_name(key, names, N_BORNHOST))
                born = value;
            else if (is_name(key, names, N_SYSFLAG))
                return 0;
        } else if (!(key.n >= 2 && key.p[0] == '_' && key.p[1] == '_')) {
            Py_ssize_t slot = user_slot(&seen, user_k, key);
            if (seen.at[slot] >= 0) {
                user_v[seen.at[slot]] = value; /* a repeated key: its last value, in its first place */
                continue;
            }
            PyObject *k = text(key);
            if (k == NULL)
                return -1;
            int r = PySet_Contains(reserved, k);
            Py_DECREF(k);
            if (r < 0)
                return -1;
            if (r)
                continue;
            if (users == user_max)
                return 0;
            seen.at[slot] = (int16_t)users;
            user_k[users] = key;
            user_v[users++] = value;
        }
    }
    int kind = TYPE_NORMAL, delay = 0;
    long long deliver_ms = 0;
    if (group.n > 0) {
        kind = TYPE_FIFO;
    } else if (deliver.n > 0) {
        if (!ascii(deliver.p, deliver.n))
            return 0;
        Py_ssize_t i;
        for (i = 0; i < deliver.n && deliver.p[i] >= '0' && deliver.p[i] <= '9'; i++)
            if (i < 18)
                deliver_ms = deliver_ms * 10 + (deliver.p[i] - '0');
        if (i == deliver.n) {
            if (deliver.n > 18 || !in_range(deliver_ms))
                return 0;
            kind = TYPE_DELAY;
            delay = 1;
        }
    }
    if (!in_range(born_ms) || !in_range(store_ms))
        return 0;
    if (born.n > 0 && chars_past(born, born_max) > born_max) /* a forged text: never kept among the hosts */
        return 0;
    const char *body = end;
    Py_ssize_t body_n = data + size - end;
    int shown = tags.n > 0 && memchr(tags.p, '\x01', (size_t)tags.n) == NULL;
    if (shown)
        tag = tags;

    /* system properties */
    growable sys = {NULL, 0, 0};
    int ok = -1, r;
    PyObject *borntext = NULL; /* borrowed from hosts */
    if (tag.n > 0 && bytes_field(&sys, 1, tag.p, tag.n) < 0)
        goto done;
    if (keys.n > 0) {
        const char *k = keys.p, *kend = keys.p + keys.n;
        while (k <= kend) {
            const char *sp = memchr(k, ' ', (size_t)(kend - k));
            if (sp == NULL)
                sp = kend;
            if (sp > k && bytes_field(&sys, 2, k, sp - k) < 0)
                goto done;
            k = sp + 1;
        }
    }
    if (uniq.n > 0) {
        if (bytes_field(&sys, 3, uniq.p, uniq.n) < 0)
            goto done;
    } else if (id_field(&sys, msg_id) < 0) {
        goto done;
    }
    if ((r = digest_field(&sys, body, body_n)) <= 0) {
        ok = r;
        goto done;
    }
    if (int_field(&sys, 5, ENCODING_IDENTITY) < 0 || int_field(&sys, 6, (uint64_t)kind) < 0 ||
        time_field(&sys, 7, born_ms) < 0)
        goto done;
    if (born.n > 0) {
        PyObject *key = text(born);
        if (key == NULL)
            goto done;
        borntext = PyDict_GetItemWithError(hosts, key);
        if (borntext == NULL) {
            if (!PyErr_Occurred()) {
                *unknown = key;
                ok = 2;
            } else {
                Py_DECREF(key);
            }
            goto done;
        }
        Py_DECREF(key); /* hosts holds its own key and the host, and no Python runs before borntext is used */
        if (borntext != Py_None && require_text(borntext, "a host") < 0)
            goto done;
    }
    if (str_field(&sys, 8, borntext != NULL && borntext != Py_None ? borntext : endpoint) < 0 ||
        time_field(&sys, 9, store_ms) < 0 || str_field(&sys, 10, endpoint) < 0)
        goto done;
    if (delay && time_field(&sys, 11, deliver_ms) < 0)
        goto done;
    if (handle != NULL && str_field(&sys, 12, handle) < 0)
        goto done;
    if (queue_id && int_field(&sys, 13, (uint64_t)queue_id) < 0)
        goto done;
    if (int_field(&sys, 14, (uint64_t)queue_offset) < 0)
        goto done;
    if (handle != NULL && (time_field(&sys, 15, invisible_ms) < 0 || int_field(&sys, 16, (uint64_t)attempt) < 0))
        goto done;
    if (group.n > 0 && bytes_field(&sys, 17, group.p, group.n) < 0)
        goto done;

    /* the message: its topic, user properties, system properties and body; then as field 2 of the response */
    Py_ssize_t tn;
    const char *tp = PyUnicode_AsUTF8AndSize(topic, &tn);
    if (tp == NULL)
        goto done;
    Py_ssize_t resource = 1 + vsize((uint64_t)tn) + tn;
    Py_ssize_t msize = 1 + vsize((uint64_t)resource) + resource;
    for (Py_ssize_t i = 0; i < users; i++) {
        Py_ssize_t entry = 2 + vsize((uint64_t)user_k[i].n) + user_k[i].n + vsize((uint64_t)user_v[i].n) + user_v[i].n;
        msize += 1 + vsize((uint64_t)entry) + entry;
    }
    msize += 1 + vsize((uint64_t)sys.len) + sys.len;
    if (body_n > 0)
        msize += 1 + vsize((uint64_t)body_n) + body_n;
    if (grow(g, msize + 12) < 0)
        goto done;
    put_v(g, 2 << 3 | 2);
    put_v(g, (uint64_t)msize);
    put_v(g, 1 << 3 | 2);
    put_v(g, (uint64_t)resource);
    put_v(g, 2 << 3 | 2);
    put_v(g, (uint64_t)tn);
    memcpy(g->p + g->len, tp, (size_t)tn);
    g->len += tn;
    for (Py_ssize_t i = 0; i < users; i++) {
        Py_ssize_t entry = 2 + vsize((uint64_t)user_k[i].n) + user_k[i].n + vsize((uint64_t)user_v[i].n) + user_v[i].n;
        put_v(g, 2 << 3 | 2);
        put_v(g, (uint64_t)entry);
        put_v(g, 1 << 3 | 2);
        put_v(g, (uint64_t)user_k[i].n);
        memcpy(g->p + g->len, user_k[i].p, (size_t)user_k[i].n);
        g->len += user_k[i].n;
        put_v(g, 2 << 3 | 2);
        put_v(g, (uint64_t)user_v[i].n);
        memcpy(g->p + g->len, user_v[i].p, (size_t)user_v[i].n);
        g->len += user_v[i].n;
    }
    put_v(g, 3 << 3 | 2);
    put_v(g, (uint64_t)sys.len);
    memcpy(g->p + g->len, sys.p, (size_t)sys.len);
    g->len += sys.len;
    if (body_n > 0) {
        put_v(g, 4 << 3 | 2);
        put_v(g, (uint64_t)body_n);
        memcpy(g->p + g->len, body, (size_t)body_n);
        g->len += body_n;
    }
    ok = 1;
done:
    PyMem_Free(sys.p);
    return ok;
}

static int as_ll(PyObject *o, long long *out) {
    if (!PyLong_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "served_record: an int expected");
        return -1;
    }
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (*out == -1 && PyErr_Occurred())
        return -1;
    return overflow ? 1 : 0;
}

PyObject *served_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "served_record(data, flag, topic, queue_id, queue_offset, born_ms, store_ms, "
                                         "msg_id, endpoint, served, context)");
        return NULL;
    }
    PyObject *topic = args[2], *msg_id = args[7], *endpoint = args[8], *sv = args[9], *ctx = args[10];
    PyObject *handle = NULL;
    long long v[5], attempt = 0, invisible_ms = 0;
    int wide = 0;
    if (!PyTuple_Check(ctx) || PyTuple_GET_SIZE(ctx) != 6 || !PyTuple_Check(PyTuple_GET_ITEM(ctx, 0)) ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(ctx, 0)) != N_NAMES || !PyAnySet_Check(PyTuple_GET_ITEM(ctx, 3)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(ctx, 4))) {
        PyErr_SetString(PyExc_TypeError, "served_record: a context as messagebytes makes it");
        return NULL;
    }
    for (int i = 0; i < N_NAMES; i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(PyTuple_GET_ITEM(ctx, 0), i))) {
            PyErr_SetString(PyExc_TypeError, "served_record: the context's names are bytes");
            return NULL;
        }
    if (!PyUnicode_Check(endpoint)) {
        PyErr_SetString(PyExc_TypeError, "served_record: the endpoint is text");
        return NULL;
    }
    if (sv != Py_None) {
        if (!PyTuple_Check(sv) || PyTuple_GET_SIZE(sv) != 6) {
            PyErr_SetString(PyExc_TypeError, "served_record: served is a Served or None");
            return NULL;
        }
        topic = PyTuple_GET_ITEM(sv, 0);
        handle = PyTuple_GET_ITEM(sv, 3);
        int r1 = as_ll(PyTuple_GET_ITEM(sv, 4), &attempt), r2 = r1 < 0 ? -1 : as_ll(PyTuple_GET_ITEM(sv, 5), &invisible_ms);
        if (r1 < 0 || r2 < 0)
            return NULL;
        wide |= r1 | r2;
        if (!PyUnicode_Check(handle)) {
            PyErr_SetString(PyExc_TypeError, "served_record: a receipt handle is text");
            return NULL;
        }
    }
    if (!PyUnicode_Check(topic)) {
        PyErr_SetString(PyExc_TypeError, "served_record: a topic is text");
        return NULL;
    }
    PyObject *ints[5] = {args[1], sv != Py_None ? PyTuple_GET_ITEM(sv, 1) : args[3],
                         sv != Py_None ? PyTuple_GET_ITEM(sv, 2) : args[4], args[5], args[6]};
    for (int i = 0; i < 5; i++) {
        int r = as_ll(ints[i], &v[i]);
        if (r < 0)
            return NULL;
        wide |= r;
    }
    if (wide) /* an int past 64 bits: the general mapping's to say what it makes of it */
        Py_RETURN_NONE;
    Py_buffer b;
    if (PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE) < 0)
        return NULL;
    growable g = {NULL, 0, 0};
    PyObject *out = NULL;
    int r = served(&g, b.buf, b.len, v[0], topic, v[1], v[2], v[3], v[4], msg_id, endpoint, handle, attempt,
                   invisible_ms, ctx, &out);
    PyBuffer_Release(&b);
    if (r == 1)
        out = PyBytes_FromStringAndSize((const char *)g.p, g.len);
    else if (r == 0)
        out = Py_NewRef(Py_None);
    PyMem_Free(g.p);
    return out;
}
#endif /* METAQ_HAVE_OPENSSL */
