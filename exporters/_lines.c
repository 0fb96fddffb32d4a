/* exporters._lines: the exposition lines of a block of ports, put together in C.
 *
 * Why: at fabric scale most of a publish is the families whose values move
 * every poll (the traffic counters, utilization, transmit-wait ratio): 13 lines a port, 1.5
 * million lines a poll at 118,400 ports. Put together in Python each line is a list of five
 * strings joined and encoded (label, head, value, ...), and each value a str object split out of
 * orjson's text: about 15 ms a family and 60 ms for the ratios. Here a block's lines are written
 * straight into bytes from the labels' text and the values (a uint64 column, or orjson's text of
 * a float column) with no object a line: 2-5x less.
 *
 * The text is exactly what the Python way writes (exporters/render.py; the tests compare both on
 * every kind of value): integers as str() does, floats as orjson spells them respelled as repr()
 * does below 1e-4 (exporters/valuetext._small), no line where a float is null (None or NaN).
 * Optional: without a C compiler ibmon installs without this module and renders in Python.
 *
 * lines(labels, columns, per_chunk) -> list[bytes]
 *   labels:    list of str, one a port (the escaped label text)
 *   columns:   tuple of 1 to 4 (head: bytes, mid: bytes, values) where values is a buffer of
 *              len(labels) uint64 (array('Q')) or bytes "[v,v,...]" (orjson) of len(labels)
 *              numbers or nulls
 *   per_chunk: ports a chunk of the result
 * For each port, for each column: head + label + mid + value + "\n" (none for a null).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_COLUMNS 4

typedef struct {
    const char *head;
    Py_ssize_t head_len;
    const char *mid;
    Py_ssize_t mid_len;
    Py_buffer ints;       /* a uint64 column when ints.obj is set */
    const char *text;     /* else orjson's text of a float column */
    Py_ssize_t text_len;
    Py_ssize_t at;        /* the next value's offset in text */
} column_t;

static const char DIGIT_PAIRS[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

static char *put_u64(char *out, uint64_t v)
{
    char tmp[20];
    char *p = tmp + sizeof tmp;
    while (v >= 100) {
        unsigned pair = (unsigned)(v % 100);
        v /= 100;
        p -= 2;
        memcpy(p, DIGIT_PAIRS + 2 * pair, 2);
    }
    if (v >= 10) {
        p -= 2;
        memcpy(p, DIGIT_PAIRS + 2 * v, 2);
    } else {
        *--p = (char)('0' + v);
    }
    size_t n = (size_t)(tmp + sizeof tmp - p);
    memcpy(out, p, n);
    return out + n;
}

/* A label's UTF-8 text: the str's own bytes when it is ASCII (every label of a fabric: GUIDs
 * and port numbers), else its cached UTF-8 copy. NULL with an exception set if not a str. */
static const char *label_text(PyObject *label, Py_ssize_t *len)
{
    if (PyUnicode_CheckExact(label) && PyUnicode_IS_COMPACT_ASCII(label)) {
        *len = PyUnicode_GET_LENGTH(label);
        return (const char *)PyUnicode_DATA(label);
    }
    if (!PyUnicode_Check(label)) {
        PyErr_SetString(PyExc_TypeError, "labels must be str");
        return NULL;
    }
    return PyUnicode_AsUTF8AndSize(label, len);
}

/* One float's text as repr() spells it: orjson writes 1e-5 <= |x| < 1e-4 positionally
 * ("0.000025", repr "2.5e-05") and a one-digit exponent without its 0 ("2.5e-7", repr
 * "2.5e-07"); every other text is repr's already. Never longer than the text plus one. */
static char *put_float(char *out, const char *t, Py_ssize_t n)
{
    if (n >= 3 && t[n - 3] == 'e' && t[n - 2] == '-' && t[n - 1] >= '1' && t[n - 1] <= '9') {
        memcpy(out, t, (size_t)(n - 1));
        out += n - 1;
        *out++ = '0';
        *out++ = t[n - 1];
        return out;
    }
    Py_ssize_t sign = n > 0 && t[0] == '-';
    if (n - sign > 6 && memcmp(t + sign, "0.0000", 6) == 0) {
        const char *d = t + sign + 6; /* the digits; the first is not 0 */
        Py_ssize_t dn = n - sign - 6;
        if (sign)
            *out++ = '-';
        *out++ = d[0];
        if (dn > 1) {
            *out++ = '.';
            memcpy(out, d + 1, (size_t)(dn - 1));
            out += dn - 1;
        }
        memcpy(out, "e-05", 4);
        return out + 4;
    }
    memcpy(out, t, (size_t)n);
    return out + n;
}

/* The end of the value starting at text[at]: the offset of the ',' or ']' after it, or -1. */
static Py_ssize_t value_end(const column_t *c, Py_ssize_t at)
{
    for (Py_ssize_t p = at; p < c->text_len; p++)
        if (c->text[p] == ',' || c->text[p] == ']')
            return p;
    return -1;
}

static int parse_column(PyObject *spec, Py_ssize_t n, column_t *c)
{
    PyObject *values;
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 3) {
        PyErr_SetString(PyExc_TypeError, "a column is (head, mid, values)");
        return -1;
    }
    if (!PyArg_ParseTuple(spec, "y#y#O", &c->head, &c->head_len, &c->mid, &c->mid_len, &values))
        return -1;
    if (PyBytes_Check(values)) {
        c->text = PyBytes_AS_STRING(values);
        c->text_len = PyBytes_GET_SIZE(values);
        if (c->text_len < 2 || c->text[0] != '[' || c->text[c->text_len - 1] != ']') {
            PyErr_SetString(PyExc_ValueError, "float values must be a JSON list");
            return -1;
        }
        c->at = 1;
        if (n == 0 && c->text_len != 2) {
            PyErr_SetString(PyExc_ValueError, "more values than labels");
            return -1;
        }
        return 0;
    }
    if (PyObject_GetBuffer(values, &c->ints, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    const char *f = c->ints.format;
    if (f[0] == '<' || f[0] == '=' || f[0] == '@')
        f++;
    if (c->ints.itemsize != 8 || (strcmp(f, "Q") != 0 && strcmp(f, "L") != 0)
        || c->ints.len != 8 * n) {
        PyErr_SetString(PyExc_ValueError, "int values must be len(labels) uint64");
        return -1;
    }
    return 0;
}

/* One chunk: ports lo..hi-1; ``ends`` has room for each float column's end of each value. */
static PyObject *chunk(PyObject *labels, column_t *cols, Py_ssize_t ncols, Py_ssize_t lo,
                       Py_ssize_t hi, Py_ssize_t n, Py_ssize_t *ends)
{
    Py_ssize_t size = 0;
    for (Py_ssize_t i = lo; i < hi; i++) {
        Py_ssize_t len;
        if (label_text(PyList_GET_ITEM(labels, i), &len) == NULL)
            return NULL;
        size += ncols * len;
    }
    for (Py_ssize_t k = 0; k < ncols; k++) {
        column_t *c = &cols[k];
        size += (hi - lo) * (c->head_len + c->mid_len + 1);
        if (c->ints.obj != NULL) {
            size += (hi - lo) * 20;
            continue;
        }
        /* This chunk's values: check there are as many as ports, and bound their text. */
        Py_ssize_t p = c->at;
        for (Py_ssize_t i = lo; i < hi; i++) {
            p = value_end(c, p);
            if (p < 0 || (c->text[p] == ']') != (i == n - 1)) {
                PyErr_SetString(PyExc_ValueError, "not one value a label");
                return NULL;
            }
            ends[(i - lo) * ncols + k] = p++;
        }
        size += 2 * (p - c->at);
    }
    PyObject *out_obj = PyBytes_FromStringAndSize(NULL, size);
    if (out_obj == NULL)
        return NULL;
    char *start = PyBytes_AS_STRING(out_obj);
    char *out = start;
    for (Py_ssize_t i = lo; i < hi; i++) {
        Py_ssize_t len;
        const char *label = label_text(PyList_GET_ITEM(labels, i), &len); /* checked above */
        for (Py_ssize_t k = 0; k < ncols; k++) {
            column_t *c = &cols[k];
            const char *t = NULL;
            Py_ssize_t tn = 0;
            if (c->ints.obj == NULL) {
                Py_ssize_t end = ends[(i - lo) * ncols + k];
                t = c->text + c->at;
                tn = end - c->at;
                c->at = end + 1;
                if (tn == 4 && memcmp(t, "null", 4) == 0)
                    continue;
            }
            memcpy(out, c->head, (size_t)c->head_len);
            out += c->head_len;
            memcpy(out, label, (size_t)len);
            out += len;
            memcpy(out, c->mid, (size_t)c->mid_len);
            out += c->mid_len;
            if (c->ints.obj != NULL)
                out = put_u64(out, ((const uint64_t *)c->ints.buf)[i]);
            else
                out = put_float(out, t, tn);
            *out++ = '\n';
        }
    }
    if (_PyBytes_Resize(&out_obj, out - start) < 0)
        return NULL;
    return out_obj;
}

static PyObject *lines(PyObject *self, PyObject *args)
{
    PyObject *labels, *specs, *result = NULL;
    Py_ssize_t per_chunk, *ends = NULL;
    column_t cols[MAX_COLUMNS];
    Py_ssize_t ncols = 0, parsed = 0;
    (void)self;
    memset(cols, 0, sizeof cols);
    if (!PyArg_ParseTuple(args, "O!O!n", &PyList_Type, &labels, &PyTuple_Type, &specs,
                          &per_chunk))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(labels);
    ncols = PyTuple_GET_SIZE(specs);
    if (ncols < 1 || ncols > MAX_COLUMNS || per_chunk < 1) {
        PyErr_SetString(PyExc_ValueError, "1 to 4 columns, at least 1 port a chunk");
        return NULL;
    }
    for (; parsed < ncols; parsed++)
        if (parse_column(PyTuple_GET_ITEM(specs, parsed), n, &cols[parsed]) < 0) {
            parsed++; /* its buffer, if it got one */
            goto done;
        }
    /* where each value of a chunk ends, found when the chunk's size is bounded */
    ends = PyMem_New(Py_ssize_t, (size_t)ncols * (size_t)(per_chunk < n ? per_chunk : n + 1));
    if (ends == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyList_New(0);
    if (result == NULL)
        goto done;
    for (Py_ssize_t lo = 0; lo < n; lo += per_chunk) {
        Py_ssize_t hi = n - lo > per_chunk ? lo + per_chunk : n;
        PyObject *part = chunk(labels, cols, ncols, lo, hi, n, ends);
        if (part == NULL || PyList_Append(result, part) < 0) {
            Py_XDECREF(part);
            Py_CLEAR(result);
            goto done;
        }
        Py_DECREF(part);
    }
done:
    PyMem_Free(ends);
    for (Py_ssize_t k = 0; k < parsed; k++)
        if (cols[k].ints.obj != NULL)
            PyBuffer_Release(&cols[k].ints);
    return result;
}

static PyMethodDef methods[] = {
    {"lines", lines, METH_VARARGS,
     "lines(labels, columns, per_chunk) -> list[bytes]: a block's exposition lines."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "exporters._lines",
    "A block's exposition lines put together in C (exporters/_lines.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__lines(void)
{
    return PyModule_Create(&module);
}
