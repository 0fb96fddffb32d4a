/* ibmon.sources._madloop: the MAD worker's send/receive loop (libibmad.MadEngine.run) in C.
 *
 * Why: a MAD costs the worker about 22 us of CPU under ibsim, and 10 of
 * them were Python (building the MAD, three ctypes calls, matching the answer, a result tuple);
 * a cold start sends 10,252 MADs and a 118,400-port poll about 240,000. Here the same loop runs
 * with no Python object a MAD but the answer's payload and its result tuple.
 *
 * It is MadEngine._run_python line for line (libibmad.py; the tests run both on the simulator
 * and compare every answer): up to `window` MADs in flight, answers matched by transaction ID
 * (the low 32 bits; umad2sim and the kernel own the high ones), expiry looked up on the oldest
 * outstanding MAD only (sends happen in deadline order), a send the kernel returns as timed out
 * or a MAD that is not a response retried like a lost one, `retries` times, in front of the
 * untried ones. libibumad is called through the addresses ctypes found (umad_send, umad_recv,
 * umad_set_addr), so the library, and under ibsim umad2sim, see the same calls as before.
 * Optional: without a C compiler ibmon installs without this module and loops in Python.
 *
 * run(requests, fns, fd, agents, bufs, timeout, retries, window, tid, emit, chunk)
 *   -> (results, tid, sent, timeouts)
 *   requests: sequence of (mgmt_class, attr_id, attr_mod, lid, path or None, port_select or None)
 *   fns:      (umad_send, umad_recv, umad_set_addr) addresses
 *   agents:   (SMI, directed-route SMI, PMA) agent IDs
 *   bufs:     (send umad address, receive umad address, offset of the MAD in a umad buffer)
 *   timeout:  seconds a MAD is waited for; retries: resends after the first
 *   tid:      the last transaction ID used (the next one is tid + 1, never 0)
 *   emit:     None, or called with each next `chunk` results (request order) once all are in
 *   results:  (payload bytes or None, error or None) for the requests not emitted
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAD_SIZE 256
#define PAYLOAD 64
#define CLASS_SMI 0x01
#define CLASS_SMI_DIRECT 0x81
#define CLASS_PMA 0x04
#define METHOD_GET 0x01
#define PERMISSIVE_LID 0xFFFF
#define QP1_QKEY 0x80010000u
#define ETIMEDOUT_STATUS 110
#define MAX_HOPS 127 /* the initial path is bytes 129..255 of the MAD (as far as Python goes) */

typedef int (*send_fn)(int fd, int agent, void *umad, int length, int timeout_ms, int retries);
typedef int (*recv_fn)(int fd, void *umad, int *length, int timeout_ms);
typedef int (*set_addr_fn)(void *umad, int dlid, int dqp, int sl, int qkey);

typedef struct {
    int mgmt_class, attr_id, directed, hops, port_select;
    uint32_t attr_mod;
    int lid;
    unsigned char path[MAX_HOPS];
} request;

typedef struct {       /* one send: which request, and until when it is waited for */
    Py_ssize_t idx;
    int64_t deadline;
    char pending;
} send_slot;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int as_int(PyObject *o, long lo, long hi, long *out)
{
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "MAD request field %ld out of range", v);
        return -1;
    }
    *out = v;
    return 0;
}

/* One request tuple into `r` (the fields _build_into and _send read). */
static int parse_request(PyObject *item, request *r)
{
    PyObject *t = PySequence_Fast(item, "a MAD request is a tuple");
    long v;
    int rc = -1;
    if (t == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(t) != 6) {
        PyErr_SetString(PyExc_ValueError, "a MAD request has 6 fields");
        goto done;
    }
    PyObject **f = PySequence_Fast_ITEMS(t);
    if (as_int(f[0], 0, 255, &v) < 0) goto done;
    r->mgmt_class = (int)v;
    if (as_int(f[1], 0, 0xFFFF, &v) < 0) goto done;
    r->attr_id = (int)v;
    if (as_int(f[2], 0, 0xFFFFFFFFL, &v) < 0) goto done;
    r->attr_mod = (uint32_t)v;
    if (as_int(f[3], 0, 0xFFFF, &v) < 0) goto done;
    r->lid = (int)v;
    r->directed = f[4] != Py_None;
    r->hops = 0;
    if (r->directed) {
        PyObject *p = PySequence_Fast(f[4], "a MAD path is a tuple of ports");
        if (p == NULL) goto done;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(p);
        if (n > MAX_HOPS) {
            Py_DECREF(p);
            PyErr_SetString(PyExc_IndexError, "directed route longer than the MAD holds");
            goto done;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            if (as_int(PySequence_Fast_GET_ITEM(p, i), 0, 255, &v) < 0) {
                Py_DECREF(p);
                goto done;
            }
            r->path[i] = (unsigned char)v;
        }
        r->hops = (int)n;
        Py_DECREF(p);
    }
    r->port_select = -1;
    if (f[5] != Py_None) {
        if (as_int(f[5], 0, 255, &v) < 0) goto done;
        r->port_select = (int)v;
    }
    rc = 0;
done:
    Py_DECREF(t);
    return rc;
}

static void put16(unsigned char *p, unsigned v) { p[0] = (unsigned char)(v >> 8); p[1] = (unsigned char)v; }

static void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

/* The Get MAD for `r` (libibmad._build_into: IBA 13.4.3, 14.2.1.2 DR SMP). */
static void build(unsigned char *mad, const request *r, uint32_t tid)
{
    memset(mad, 0, MAD_SIZE);
    mad[0] = 1;
    mad[1] = (unsigned char)(r->directed ? CLASS_SMI_DIRECT : r->mgmt_class);
    mad[2] = 1;
    mad[3] = METHOD_GET;
    put32(mad + 12, tid); /* TransactionID: 64 bits at 8, the high 32 stay 0 */
    put16(mad + 16, (unsigned)r->attr_id);
    put32(mad + 20, r->attr_mod);
    if (r->directed) {
        mad[7] = (unsigned char)r->hops;
        put16(mad + 32, PERMISSIVE_LID);
        put16(mad + 34, PERMISSIVE_LID);
        for (int i = 0; i < r->hops; i++)
            mad[128 + 1 + i] = r->path[i];
    }
    if (r->mgmt_class == CLASS_PMA && r->port_select >= 0)
        mad[PAYLOAD + 1] = (unsigned char)r->port_select;
}

static PyObject *result_tuple(PyObject *data, const char *error)
{
    PyObject *err = error ? PyUnicode_FromString(error) : (Py_INCREF(Py_None), Py_None);
    if (err == NULL) {
        Py_XDECREF(data);
        return NULL;
    }
    if (data == NULL) {
        Py_INCREF(Py_None);
        data = Py_None;
    }
    PyObject *t = PyTuple_New(2);
    if (t == NULL) {
        Py_DECREF(data);
        Py_DECREF(err);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, data);
    PyTuple_SET_ITEM(t, 1, err);
    return t;
}

static PyObject *run(PyObject *self, PyObject *args)
{
    PyObject *requests, *emit;
    unsigned long long f_send, f_recv, f_addr, send_buf, recv_buf;
    int fd, a_smi, a_dsmi, a_pma, retries, window;
    Py_ssize_t mad_off, chunk;
    double timeout;
    unsigned long tid_in;
    (void)self;
    if (!PyArg_ParseTuple(args, "O(KKK)i(iii)(KKn)diikOn", &requests, &f_send, &f_recv, &f_addr,
                          &fd, &a_smi, &a_dsmi, &a_pma, &send_buf, &recv_buf, &mad_off, &timeout,
                          &retries, &window, &tid_in, &emit, &chunk))
        return NULL;
    if (mad_off < 0 || mad_off > 4096 || window < 1 || retries < 0 || chunk < 1 || timeout <= 0) {
        PyErr_SetString(PyExc_ValueError, "bad MAD loop arguments");
        return NULL;
    }
    send_fn do_send = (send_fn)(uintptr_t)f_send;
    recv_fn do_recv = (recv_fn)(uintptr_t)f_recv;
    set_addr_fn set_addr = (set_addr_fn)(uintptr_t)f_addr;
    unsigned char *smad = (unsigned char *)(uintptr_t)send_buf + mad_off;
    unsigned char *rhead = (unsigned char *)(uintptr_t)recv_buf;
    unsigned char *rmad = rhead + mad_off;
    int tmo_ms = (int)(timeout * 1000) > 1 ? (int)(timeout * 1000) : 1;
    int64_t timeout_ns = (int64_t)(timeout * 1e9);

    PyObject *seq = PySequence_Fast(requests, "requests must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = NULL, *ret = NULL;
    request *reqs = PyMem_Calloc(n ? (size_t)n : 1, sizeof(request));
    PyObject **results = PyMem_Calloc(n ? (size_t)n : 1, sizeof(PyObject *));
    int *tries = PyMem_Calloc(n ? (size_t)n : 1, sizeof(int));
    Py_ssize_t *redo = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_ssize_t)); /* retry stack */
    Py_ssize_t cap = n + 16;
    send_slot *slots = PyMem_Calloc((size_t)cap, sizeof(send_slot));
    if (!reqs || !results || !tries || !redo || !slots) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (parse_request(PySequence_Fast_GET_ITEM(seq, i), &reqs[i]) < 0)
            goto fail;

    /* Transaction IDs tid0 + s for send s: one range with no 0 and no wrap, so an answer maps
     * to its send by subtraction (Python: the same sequence, _next_tid, by dict). */
    uint32_t tid0 = (uint32_t)tid_in + 1;
    uint64_t most = (uint64_t)n * (uint64_t)(retries + 1);
    if (tid0 == 0 || (uint64_t)tid0 + most > 0xFFFFFFFFull)
        tid0 = 1;
    Py_ssize_t fresh = 0, nredo = 0;     /* untried requests from `fresh`; retries on `redo` */
    Py_ssize_t nsent = 0, oldest = 0, inflight = 0;
    Py_ssize_t done = 0, emitted = 0;
    long sent = 0, timeouts = 0;
    int addr_dlid = -1, addr_qp = -1, addr_qkey = -1; /* the address last set (-1: none) */

#define RETRY_OR_FAIL(IDX)                                                                  \
    do {                                                                                    \
        Py_ssize_t idx_ = (IDX);                                                            \
        if (tries[idx_] < retries) {                                                        \
            tries[idx_]++;                                                                  \
            redo[nredo++] = idx_;                                                           \
        } else {                                                                            \
            timeouts++;                                                                     \
            if ((results[idx_] = result_tuple(NULL, "timeout")) == NULL) goto fail;        \
        }                                                                                   \
    } while (0)

    while (fresh < n || nredo > 0 || inflight > 0) {
        int64_t now = now_ns();
        while ((fresh < n || nredo > 0) && inflight < window) {
            Py_ssize_t idx = nredo > 0 ? redo[--nredo] : fresh++;
            const request *r = &reqs[idx];
            uint32_t tid = tid0 + (uint32_t)nsent;
            if (nsent == cap) {
                Py_ssize_t ncap = cap * 2;
                send_slot *more = PyMem_Realloc(slots, (size_t)ncap * sizeof(send_slot));
                if (more == NULL) {
                    PyErr_NoMemory();
                    goto fail;
                }
                memset(more + cap, 0, (size_t)(ncap - cap) * sizeof(send_slot));
                slots = more;
                cap = ncap;
            }
            build(smad, r, tid);
            int dlid, qp, qkey, agent;
            if (r->directed) {
                dlid = PERMISSIVE_LID; qp = 0; qkey = 0; agent = a_dsmi;
            } else if (r->mgmt_class == CLASS_PMA) {
                dlid = r->lid; qp = 1; qkey = (int)QP1_QKEY; agent = a_pma;
            } else {
                dlid = r->lid; qp = 0; qkey = 0; agent = a_smi;
            }
            if (dlid != addr_dlid || qp != addr_qp || qkey != addr_qkey) {
                set_addr((void *)(uintptr_t)send_buf, dlid, qp, 0, qkey);
                addr_dlid = dlid; addr_qp = qp; addr_qkey = qkey;
            }
            int rc;
            Py_BEGIN_ALLOW_THREADS
            rc = do_send(fd, agent, (void *)(uintptr_t)send_buf, MAD_SIZE, tmo_ms, 0);
            Py_END_ALLOW_THREADS
            sent++;
            slots[nsent].idx = idx;
            slots[nsent].deadline = now + timeout_ns;
            slots[nsent].pending = rc >= 0;
            nsent++;
            if (rc < 0) {
                if ((results[idx] = result_tuple(NULL, "send_failed")) == NULL) goto fail;
                continue;
            }
            inflight++;
        }
        if (inflight == 0)
            continue;
        while (!slots[oldest].pending) /* answered: skip to the oldest one still out */
            oldest++;
        int64_t left = (slots[oldest].deadline - now) / 1000000;
        int wait_ms = left < 0 ? 0 : (left > 50 ? 50 : (int)left);
        int length = MAD_SIZE, got;
        Py_BEGIN_ALLOW_THREADS
        got = do_recv(fd, (void *)(uintptr_t)recv_buf, &length, wait_ms);
        Py_END_ALLOW_THREADS
        if (got >= 0) {
            uint32_t tid = ((uint32_t)rmad[12] << 24) | ((uint32_t)rmad[13] << 16) |
                           ((uint32_t)rmad[14] << 8) | rmad[15];
            uint32_t s = tid - tid0;
            if (tid >= tid0 && (Py_ssize_t)s < nsent && slots[s].pending) {
                Py_ssize_t idx = slots[s].idx;
                uint32_t ustatus;
                slots[s].pending = 0;
                inflight--;
                memcpy(&ustatus, rhead + 4, sizeof ustatus); /* ib_user_mad.status */
                if (ustatus == ETIMEDOUT_STATUS || !(rmad[3] & 0x80)) {
                    RETRY_OR_FAIL(idx); /* the kernel returned our own send: it timed out */
                } else {
                    unsigned status = ((unsigned)rmad[4] << 8) | rmad[5];
                    if (rmad[1] == CLASS_SMI_DIRECT)
                        status &= 0x7FFF;
                    if (status & 0x1C) { /* bad version / method / attribute / value */
                        char why[16];
                        snprintf(why, sizeof why, "status_0x%04x", status);
                        results[idx] = result_tuple(NULL, why);
                    } else {
                        PyObject *data = PyBytes_FromStringAndSize(
                            (const char *)rmad + PAYLOAD, MAD_SIZE - PAYLOAD);
                        if (data == NULL) goto fail;
                        results[idx] = result_tuple(data, NULL);
                    }
                    if (results[idx] == NULL) goto fail;
                }
            }
            now = now_ns();
        }
        while (oldest < nsent && slots[oldest].deadline <= now) {
            if (slots[oldest].pending) {
                slots[oldest].pending = 0;
                inflight--;
                RETRY_OR_FAIL(slots[oldest].idx);
            }
            oldest++;
        }
        if (oldest == nsent && inflight > 0) { /* cannot happen: every pending slot is >= oldest */
            PyErr_SetString(PyExc_RuntimeError, "MAD loop lost track of a send");
            goto fail;
        }
        if (emit != Py_None && done < n && results[done] != NULL) {
            done++;
            while (done < n && results[done] != NULL)
                done++;
            if (done - emitted >= chunk) {
                PyObject *part = PyList_New(done - emitted);
                if (part == NULL) goto fail;
                for (Py_ssize_t i = emitted; i < done; i++) {
                    PyList_SET_ITEM(part, i - emitted, results[i]);
                    results[i] = NULL;
                }
                emitted = done;
                PyObject *r = PyObject_CallOneArg(emit, part);
                Py_DECREF(part);
                if (r == NULL) goto fail;
                Py_DECREF(r);
            }
        }
    }
#undef RETRY_OR_FAIL

    out = PyList_New(n - emitted);
    if (out == NULL) goto fail;
    for (Py_ssize_t i = emitted; i < n; i++) {
        PyObject *r = results[i];
        if (r == NULL && (r = result_tuple(NULL, "timeout")) == NULL) goto fail;
        results[i] = NULL;
        PyList_SET_ITEM(out, i - emitted, r);
    }
    {
        uint32_t last = nsent ? tid0 + (uint32_t)(nsent - 1) : (uint32_t)tid_in;
        ret = Py_BuildValue("(Nkll)", out, (unsigned long)last, sent, timeouts);
        out = NULL;
    }
fail:
    Py_XDECREF(out);
    if (results != NULL)
        for (Py_ssize_t i = 0; i < n; i++)
            Py_XDECREF(results[i]);
    PyMem_Free(reqs);
    PyMem_Free(results);
    PyMem_Free(tries);
    PyMem_Free(redo);
    PyMem_Free(slots);
    Py_DECREF(seq);
    return ret;
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS,
     "run(requests, fns, fd, agents, bufs, timeout, retries, window, tid, emit, chunk) -> "
     "(results, tid, sent, timeouts): one batch of MADs (ibmon/sources/_madloop.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ibmon.sources._madloop",
    "The MAD worker's send/receive loop in C (ibmon/sources/_madloop.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__madloop(void)
{
    return PyModule_Create(&module);
}
