/* What the C files of metaq.native._bytes share. */
#ifndef METAQ_SPEEDUPS_H
#define METAQ_SPEEDUPS_H

#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>
#ifdef METAQ_HAVE_ISAL
#include <isa-l/crc.h>
#define CRC32_IMPL_NAME "isa-l"
#else
#define CRC32_IMPL_NAME "zlib"
#endif

#define INT32_MAX_V 2147483647LL

/* The CRC-32 of p[0:n] continued from crc (ISA-L or zlib), and v in decimal at p: inline in each file that uses
   them (the burst scanners, the record writer, the client's encoders, the MQTT framer). */
static inline unsigned long crc_of(const unsigned char *p, Py_ssize_t n, unsigned long crc) {
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
static inline int put_decimal(char *p, long long v) {
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

/* METH_FASTCALL arguments checked one by one as PyArg_ParseTuple's format codes check them (the same exceptions for
   bad types), without parsing a format string each call: the per-message entry points' (mqtt_plain_publishes,
   mqtt_read_publishes, mqtt_burst_frames, write_run, mqtt_publish_bytes, send_each). Each is 1, or 0 with an
   exception set. */
static inline int metaq_nargs(Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs == want)
        return 1;
    PyErr_Format(PyExc_TypeError, "function takes exactly %zd arguments (%zd given)", want, nargs);
    return 0;
}
static inline int metaq_arg_ll(PyObject *o, long long *out) { /* 'L' */
    *out = PyLong_AsLongLong(o);
    return !(*out == -1 && PyErr_Occurred());
}
static inline int metaq_arg_long(PyObject *o, long *out) { /* 'l' */
    *out = PyLong_AsLong(o);
    return !(*out == -1 && PyErr_Occurred());
}
static inline int metaq_arg_ssize(PyObject *o, Py_ssize_t *out) { /* 'n' */
    if (PyLong_Check(o)) {
        *out = PyLong_AsSsize_t(o);
        return !(*out == -1 && PyErr_Occurred());
    }
    PyObject *ix = PyNumber_Index(o);
    if (ix == NULL)
        return 0;
    *out = PyLong_AsSsize_t(ix);
    Py_DECREF(ix);
    return !(*out == -1 && PyErr_Occurred());
}
static inline int metaq_arg_type(int at, PyObject *o, PyTypeObject *type) { /* 'O!' and 'S' (at: from 1) */
    if (PyObject_TypeCheck(o, type))
        return 1;
    PyErr_Format(PyExc_TypeError, "argument %d must be %.50s, not %.50s", at, type->tp_name,
                 o == Py_None ? "None" : Py_TYPE(o)->tp_name);
    return 0;
}

/* The SyncWorker type (sync.c), registered by the module's init (module.c). */
extern PyTypeObject SyncWorkerType;

/* scan_idem_burst (idemburst.c), in the module's method table (module.c). */
PyObject *scan_idem_burst(PyObject *self, PyObject *args);
/* scan_put_ats (timerburst.c), in the module's method table (module.c). */
PyObject *scan_put_ats(PyObject *self, PyObject *args);
PyObject *encode_timer_acks(PyObject *self, PyObject *args);

/* scan_log, write_units and nonzero_end (recovery.c), in the module's method table (module.c). */
PyObject *scan_log(PyObject *self, PyObject *args);
PyObject *write_units(PyObject *self, PyObject *args);
PyObject *nonzero_end(PyObject *self, PyObject *args);
/* keyed_records (recovery.c): the key index's walk over the flushed log. */
PyObject *keyed_records(PyObject *self, PyObject *args);

/* mqtt_split, mqtt_publish_bytes and mqtt_pubacks (mqttwire.c): the MQTT wire's per-packet steps. */
PyObject *mqtt_split(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqtt_publish_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqtt_pubacks(PyObject *self, PyObject *ids);
/* mqtt_plain_publishes (mqttpublishes.c) and mqtt_read_publishes (mqttturn.c): the MQTT publisher's read split and staged,
   the second with the PUBACKs of its QoS 1 PUBLISHes. */
PyObject *mqtt_plain_publishes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqtt_read_publishes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* Their arguments (buf, pos, v5, max_packet, plans, decided, room, count, nbytes) checked as PyArg_ParseTuple's
   "y*npLO!O!LnL" checked them, the buffer held (released with PyBuffer_Release(&in->b)). */
typedef struct {
    Py_buffer b;
    Py_ssize_t pos, count;
    long long max_packet, room, nbytes;
    int v5;
    PyObject *plans, *decided;
} metaq_publishes_in;
int metaq_publishes_args(PyObject *const *args, Py_ssize_t nargs, metaq_publishes_in *in);
/* The split (mqttpublishes.c): its entries (a new list), in->pos moved to the next pos, how many at QoS 1 and their
   records' bytes; NULL with an exception set. */
PyObject *metaq_plain_split(metaq_publishes_in *in, Py_ssize_t *qos1, Py_ssize_t *taken);
/* A tuple of n new references, stolen; NULL (and none kept) when one is NULL or the tuple cannot be made. */
PyObject *metaq_tuple_of(Py_ssize_t n, PyObject **items);
/* mqtt_plain_pubacks (mqttacks.c): the MQTT subscriber's read of PUBACKs split: their packet ids and the next pos. */
PyObject *mqtt_plain_pubacks(PyObject *self, PyObject *args);
/* encode_fields (protobuf.c): protobuf fields written from (field number, value) pairs; metaq/rmq5/messagebytes.py. */
PyObject *encode_fields(PyObject *self, PyObject *args);
/* pop_parse_handles (pop.c): an ack's receipt handles read in one call; metaq/pop/records.py. */
PyObject *pop_parse_handles(PyObject *self, PyObject *handles);
/* pop_handle (pop.c): a receipt handle's text; metaq/pop/records.py. */
PyObject *pop_handle(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* served_record (servedmsg.c): a served RocketMQ 5 message's bytes from its log record; metaq/rmq5/messagebytes.py.
   Built with OpenSSL's libcrypto only (its MD5). */
#ifdef METAQ_HAVE_OPENSSL
PyObject *served_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
#endif
/* grpc_frames (protobuf.c): gRPC messages length-prefixed and joined; metaq/rmq5/wire.py. */
PyObject *grpc_frames(PyObject *self, PyObject *items);
/* ws_frames (wsframe.c): a WebSocket client's common frames unmasked and joined, and what the frame after them is. */
PyObject *ws_frames(PyObject *self, PyObject *args);
/* From records.c and textburst.c: the CRC-32 of p[0:n] continued from crc (ISA-L or zlib); v in decimal at p, its length. */
unsigned long metaq_crc(const unsigned char *p, Py_ssize_t n, unsigned long crc);
int metaq_decimal(char *p, long long v);
/* From idemburst.c: 1..max decimal digits at *p, then `stop`; the value in *out, *p moved past `stop`; 0 if not. */
int metaq_digits(const unsigned char **p, const unsigned char *lim, int max, unsigned char stop,
                 unsigned long long *out);
/* From textburst.c: the burst scanners' arguments parsed, the buffer held in *b; -1 with an error set. */
int metaq_scan_args(PyObject *args, Py_buffer *b, Py_ssize_t *pos, Py_ssize_t *end, Py_ssize_t *max_body,
                    Py_ssize_t *max_line, Py_ssize_t *max_frames);

/* The entry points of the module's method table (module.c), each in the file of its concern. */
PyObject *scan_puts(PyObject *self, PyObject *args);         /* textburst.c */
PyObject *encode_put_acks(PyObject *self, PyObject *args);   /* textburst.c */
PyObject *write_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs); /* records.c */
PyObject *py_record_ok(PyObject *self, PyObject *args);      /* records.c */
PyObject *scan_records(PyObject *self, PyObject *args);      /* records.c */
PyObject *py_crc32(PyObject *self, PyObject *args);          /* records.c */
PyObject *gather_records(PyObject *self, PyObject *args);    /* records.c */
PyObject *check_ranges(PyObject *self, PyObject *args);      /* records.c */
PyObject *send_ranges(PyObject *self, PyObject *args);       /* send.c */
PyObject *send_each(PyObject *self, PyObject *const *args, Py_ssize_t nargs); /* send.c */
PyObject *encode_sub_records(PyObject *self, PyObject *args);      /* client.c */
PyObject *encode_idem_sub_records(PyObject *self, PyObject *args); /* client.c */
PyObject *scan_reply(PyObject *self, PyObject *args);        /* client.c */
PyObject *gather_payloads(PyObject *self, PyObject *args);   /* client.c */
PyObject *now_ms(PyObject *self, PyObject *unused);          /* clock.c */
PyObject *mqtt_burst_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs); /* mqttpublishes.c */

#endif
