/* pop_handle: a receipt handle's text (metaq/pop/records.py's handle_py is its twin); pop_parse_handles: an ack's
   receipt handles read in one call (parse_handles_py is its twin). A handle is "<partition>:<offset>:<attempt>:<deadline_ms>", four runs of ASCII digits, at most
   HANDLE_MAX characters (records._MAX_HANDLE); anything else (not a str, longer, another form) is None, for the
   caller to say why. */
#include "native.h"

/* records._MAX_HANDLE: the longest handle text read. */
#define HANDLE_MAX 96
/* Digits a run may hold and still be read into a long long; a longer run is read by PyLong_FromString. */
#define SHORT_DIGITS 18

/* The int of the digits s[0..n) (n >= 1, all ASCII digits), a new reference. */
static PyObject *digits_int(const char *s, Py_ssize_t n) {
    if (n <= SHORT_DIGITS) {
        long long v = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            v = v * 10 + (s[i] - '0');
        return PyLong_FromLongLong(v);
    }
    char buf[HANDLE_MAX + 1];
    memcpy(buf, s, (size_t)n);
    buf[n] = '\0';
    return PyLong_FromString(buf, NULL, 10);
}

/* (partition, offset, attempt, deadline_ms) of one handle, Py_None (a new reference) when it is not one, NULL on
   an error. */
static PyObject *parse_one(PyObject *text) {
    if (!PyUnicode_Check(text) || PyUnicode_GET_LENGTH(text) > HANDLE_MAX || !PyUnicode_IS_ASCII(text))
        Py_RETURN_NONE;
    const char *s = (const char *)PyUnicode_DATA(text);
    Py_ssize_t len = PyUnicode_GET_LENGTH(text), start[4], size[4], at = 0;
    for (int k = 0; k < 4; k++) {
        start[k] = at;
        while (at < len && s[at] >= '0' && s[at] <= '9')
            at++;
        size[k] = at - start[k];
        if (size[k] == 0)
            Py_RETURN_NONE;
        if (k < 3) {
            if (at >= len || s[at] != ':')
                Py_RETURN_NONE;
            at++;
        }
    }
    if (at != len)
        Py_RETURN_NONE;
    PyObject *out = PyTuple_New(4);
    if (out == NULL)
        return NULL;
    for (int k = 0; k < 4; k++) {
        PyObject *v = digits_int(s + start[k], size[k]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, k, v);
    }
    return out;
}

PyObject *pop_parse_handles(PyObject *self, PyObject *handles) {
    if (!PyList_Check(handles)) {
        PyErr_Format(PyExc_TypeError, "pop_parse_handles: a list expected, not %.50s", Py_TYPE(handles)->tp_name);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(handles);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *one = parse_one(PyList_GET_ITEM(handles, i));
        if (one == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, one);
    }
    return out;
}

/* One int of a handle written at buf (at most room bytes: its length), or, past 64 bits, *big set to its str() (0);
   -1 with an exception set. */
static int handle_part(PyObject *o, char *buf, size_t room, PyObject **big) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (overflow) {
        *big = PyObject_Str(o);
        return *big == NULL ? -1 : 0;
    }
    char tmp[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    int len = n + (v < 0);
    if ((size_t)len > room) { /* not reached: four parts of at most 20 characters and their colons fit */
        PyErr_SetString(PyExc_SystemError, "pop_handle: the text does not fit");
        return -1;
    }
    char *w = buf;
    if (v < 0)
        *w++ = '-';
    while (n)
        *w++ = tmp[--n];
    return len;
}

PyObject *pop_handle(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!metaq_nargs(nargs, 4))
        return NULL;
    char buf[4 * 24];
    size_t at = 0;
    for (int k = 0; k < 4; k++) {
        if (!PyLong_Check(args[k])) {
            PyErr_Format(PyExc_TypeError, "pop_handle: an int expected, not %.50s", Py_TYPE(args[k])->tp_name);
            return NULL;
        }
        PyObject *big = NULL;
        int n = handle_part(args[k], buf + at, sizeof(buf) - at, &big);
        if (n < 0)
            return NULL;
        if (big != NULL) { /* past 64 bits: the general format, as the twin writes it */
            Py_DECREF(big);
            PyObject *t = PyTuple_Pack(4, args[0], args[1], args[2], args[3]);
            if (t == NULL)
                return NULL;
            PyObject *fmt = PyUnicode_FromString("%d:%d:%d:%d");
            PyObject *out = fmt == NULL ? NULL : PyUnicode_Format(fmt, t);
            Py_XDECREF(fmt);
            Py_DECREF(t);
            return out;
        }
        at += (size_t)n;
        if (k < 3)
            buf[at++] = ':';
    }
    return PyUnicode_FromStringAndSize(buf, (Py_ssize_t)at);
}
