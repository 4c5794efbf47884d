/* What the C files of metaq._speedups share. */
#ifndef METAQ_SPEEDUPS_H
#define METAQ_SPEEDUPS_H

#include <Python.h>

/* METH_FASTCALL arguments checked one by one as PyArg_ParseTuple's format codes check them (the same exceptions for
   bad types), without parsing a format string each call: the per-message entry points' (mqtt_plain_publishes,
   mqtt_read_publishes, mqtt_burst_frames). Each is 1, or 0 with an exception set. */
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

/* The SyncWorker type (_syncworker.c), registered by the module's init (_speedups.c). */
extern PyTypeObject SyncWorkerType;

/* scan_idem_burst (_idemscan.c), in the module's method table (_speedups.c). */
PyObject *scan_idem_burst(PyObject *self, PyObject *args);
/* scan_put_ats (_timerscan.c), in the module's method table (_speedups.c). */
PyObject *scan_put_ats(PyObject *self, PyObject *args);
PyObject *encode_timer_acks(PyObject *self, PyObject *args);

/* scan_log, write_units and nonzero_end (_recoveryscan.c), in the module's method table (_speedups.c). */
PyObject *scan_log(PyObject *self, PyObject *args);
PyObject *write_units(PyObject *self, PyObject *args);
PyObject *nonzero_end(PyObject *self, PyObject *args);
/* keyed_records (_recoveryscan.c): the key index's walk over the flushed log. */
PyObject *keyed_records(PyObject *self, PyObject *args);

/* mqtt_split, mqtt_publish_bytes and mqtt_pubacks (_mqttwire.c): the MQTT wire's per-packet steps. */
PyObject *mqtt_split(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *mqtt_publish_bytes(PyObject *self, PyObject *args);
PyObject *mqtt_pubacks(PyObject *self, PyObject *ids);
/* mqtt_plain_publishes (_speedups.c) and mqtt_read_publishes (_mqttturn.c): the MQTT publisher's read split and staged,
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
/* The split (_speedups.c): its entries (a new list), in->pos moved to the next pos, how many at QoS 1 and their
   records' bytes; NULL with an exception set. */
PyObject *metaq_plain_split(metaq_publishes_in *in, Py_ssize_t *qos1, Py_ssize_t *taken);
/* A tuple of n new references, stolen; NULL (and none kept) when one is NULL or the tuple cannot be made. */
PyObject *metaq_tuple_of(Py_ssize_t n, PyObject **items);
/* mqtt_plain_pubacks (_mqttacks.c): the MQTT subscriber's read of PUBACKs split: their packet ids and the next pos. */
PyObject *mqtt_plain_pubacks(PyObject *self, PyObject *args);
/* encode_fields (_pbwrite.c): protobuf fields written from (field number, value) pairs; metaq/rmq5/messagebytes.py. */
PyObject *encode_fields(PyObject *self, PyObject *args);
/* pop_parse_handles (_pophandles.c): an ack's receipt handles read in one call; metaq/pop/records.py. */
PyObject *pop_parse_handles(PyObject *self, PyObject *handles);
/* pop_handle (_pophandles.c): a receipt handle's text; metaq/pop/records.py. */
PyObject *pop_handle(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* served_record (_servedmsg.c): a served RocketMQ 5 message's bytes from its log record; metaq/rmq5/messagebytes.py.
   Built with OpenSSL's libcrypto only (its MD5). */
#ifdef METAQ_HAVE_OPENSSL
PyObject *served_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
#endif
/* grpc_frames (_pbwrite.c): gRPC messages length-prefixed and joined; metaq/rmq5/wire.py. */
PyObject *grpc_frames(PyObject *self, PyObject *items);
/* From _speedups.c: the CRC-32 of p[0:n] continued from crc (ISA-L or zlib); v in decimal at p, its length. */
unsigned long metaq_crc(const unsigned char *p, Py_ssize_t n, unsigned long crc);
int metaq_decimal(char *p, long long v);
/* From _idemscan.c: 1..max decimal digits at *p, then `stop`; the value in *out, *p moved past `stop`; 0 if not. */
int metaq_digits(const unsigned char **p, const unsigned char *lim, int max, unsigned char stop,
                 unsigned long long *out);
/* From _speedups.c: the burst scanners' arguments parsed, the buffer held in *b; -1 with an error set. */
int metaq_scan_args(PyObject *args, Py_buffer *b, Py_ssize_t *pos, Py_ssize_t *end, Py_ssize_t *max_body,
                    Py_ssize_t *max_line, Py_ssize_t *max_frames);

#endif
