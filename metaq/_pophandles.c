/* pop_parse_handles: an ack's receipt handles read in one call (metaq/pop/records.py's parse_handles_py is its
   twin). A handle is "<partition>:<offset>:<attempt>:<deadline_ms>", four runs of ASCII digits, at most
   HANDLE_MAX characters (records._MAX_HANDLE); anything else (not a str, longer, another form) is None, for the
   caller to say why. */
#include "_speedups.h"

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
