/* A WebSocket client's common frames read (metaq.protocol.wsframe.frames_py in C; the tests hold the two equal):
 *
 *   ws_frames(buf, pos, max_frame) -> (payloads, pos, head, length)
 *
 * The run of common frames whole in buf from pos (FIN, no reserved bit, binary, masked, a minimal length of at most
 * max_frame; max_frame negative: none is common), their payloads unmasked and joined; the position after them; and
 * for the frame there: head 0 when more bytes are needed (no whole header, or a common frame not yet whole), else
 * its header's bytes and the payload length it declares (the frame is not common: the WebSocket library's). */
#include "native.h"

#include <string.h>

/* One frame's header at pos in buf[0:end): 0 when it is not whole, else its bytes, with the declared length in *n,
 * whether it is common in *common. */
static Py_ssize_t ws_header(const unsigned char *buf, Py_ssize_t end, Py_ssize_t pos, long long max_frame,
                            unsigned long long *n, int *common) {
    if (end - pos < 2)
        return 0;
    unsigned char first = buf[pos], second = buf[pos + 1];
    unsigned long long len = second & 0x7F;
    Py_ssize_t at = pos + 2;
    int minimal = 1;
    if (len == 126) {
        if (end - at < 2)
            return 0;
        len = ((unsigned long long)buf[at] << 8) | buf[at + 1];
        at += 2;
        minimal = len > 125;
    } else if (len == 127) {
        if (end - at < 8)
            return 0;
        len = 0;
        for (int i = 0; i < 8; i++)
            len = (len << 8) | buf[at + i];
        at += 8;
        minimal = len > 0xFFFF;
    }
    int masked = (second & 0x80) != 0;
    if (masked) {
        at += 4;
        if (at > end)
            return 0;
    }
    *n = len;
    *common = first == 0x82 && masked && minimal && max_frame >= 0 && len <= (unsigned long long)max_frame;
    return at - pos;
}

/* The payload of n bytes at src, unmasked with the 4-byte key, into dst. */
static void ws_unmask(unsigned char *dst, const unsigned char *src, Py_ssize_t n, const unsigned char *key) {
    uint32_t k4;
    memcpy(&k4, key, 4);
    if (k4 == 0) {
        memcpy(dst, src, (size_t)n);
        return;
    }
    uint64_t k8 = ((uint64_t)k4 << 32) | k4;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) { /* (the key repeats every 4 bytes: i stays a multiple of 4) */
        uint64_t w;
        memcpy(&w, src + i, 8);
        w ^= k8;
        memcpy(dst + i, &w, 8);
    }
    for (; i < n; i++)
        dst[i] = src[i] ^ key[i & 3];
}

PyObject *ws_frames(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t pos;
    long long max_frame;
    if (!PyArg_ParseTuple(args, "y*nL:ws_frames", &b, &pos, &max_frame))
        return NULL;
    const unsigned char *buf = (const unsigned char *)b.buf;
    Py_ssize_t end = b.len;
    if (pos < 0)
        pos = 0;
    if (pos > end)
        pos = end;
    /* first the run's extent and its payloads' size, then the payloads */
    Py_ssize_t at = pos, total = 0, head;
    unsigned long long n = 0;
    int common = 0;
    while ((head = ws_header(buf, end, at, max_frame, &n, &common)) != 0 && common &&
           (unsigned long long)(end - at - head) >= n) {
        total += (Py_ssize_t)n;
        at += head + (Py_ssize_t)n;
    }
    Py_ssize_t stop = at;
    if (head != 0 && common) /* a common frame not yet whole */
        head = 0;
    if (head == 0)
        n = 0;
    PyObject *payloads = PyBytes_FromStringAndSize(NULL, total);
    if (payloads == NULL) {
        PyBuffer_Release(&b);
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(payloads);
    for (at = pos; at < stop;) {
        unsigned long long m;
        int c;
        Py_ssize_t h = ws_header(buf, end, at, max_frame, &m, &c);
        ws_unmask(out, buf + at + h, (Py_ssize_t)m, buf + at + h - 4);
        out += m;
        at += h + (Py_ssize_t)m;
    }
    PyBuffer_Release(&b);
    return Py_BuildValue("(NnnK)", payloads, stop, head, n);
}
