/* exporters._sendbody: a big response body sent without the GIL changing hands.
 *
 * Why (issue 12, target 5): while a poll's bulk work runs in worker threads, every time the
 * event loop gives the GIL away (each system call made through Python does) it waits to get it
 * back: the worker's switch interval, or a long C call. A Python sender thread needed the GIL
 * to start and the loop released it around each send, so a big scrape waited out several such
 * hand-overs before its last bytes left. Here:
 *
 * send_now(fd, parts, limit) -> int
 *   Sends up to `limit` bytes, what the (non-blocking) socket takes at once, holding the GIL:
 *   the call cannot block, and the loop keeps the GIL while the kernel copies. Returns the
 *   bytes sent (0 when the socket is full); OSError when the connection failed.
 *
 * Send(fd, parts, seconds)
 *   Sends the rest from a native thread that never takes the GIL: on a duplicate of fd, with
 *   poll() and non-blocking sendmsg(), for at most `seconds` (then what is left goes back to
 *   the caller, so a slow reader never holds the thread). The parts' buffers are held until
 *   the thread is done (`running` is False then). fileno() is an eventfd that becomes
 *   readable when it is; then finish() -> (sent, errno) joins the thread and lets the
 *   buffers go. A Send dropped early stops its thread (within POLL_SLICE_MS) first.
 *
 * parts: a list of bytes-like objects (contiguous buffers).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_IOV 1024        /* IOV_MAX on Linux */
#define POLL_SLICE_MS 100   /* how soon a dropped Send's thread notices */
#define BATCH (256 * 1024)  /* bytes a sendmsg() of the thread: the client reads meanwhile */

/* Where the next byte to send is: part `index`, `offset` bytes into it. */
typedef struct {
    Py_buffer *bufs;
    Py_ssize_t count;
    Py_ssize_t index;
    Py_ssize_t offset;
} cursor_t;

/* The next at most `limit` bytes (at least one part's worth) as an iovec. */
static int
fill_iov(const cursor_t *c, struct iovec *iov, size_t limit)
{
    int n = 0;
    size_t total = 0;
    for (Py_ssize_t i = c->index; i < c->count && n < MAX_IOV && total < limit; i++) {
        Py_ssize_t skip = i == c->index ? c->offset : 0;
        if (c->bufs[i].len - skip <= 0)
            continue;
        size_t len = (size_t)(c->bufs[i].len - skip);
        if (len > limit - total)
            len = limit - total;
        iov[n].iov_base = (char *)c->bufs[i].buf + skip;
        iov[n].iov_len = len;
        total += len;
        n++;
    }
    return n;
}

static void
advance(cursor_t *c, size_t sent)
{
    while (c->index < c->count) {
        size_t left = (size_t)(c->bufs[c->index].len - c->offset);
        if (sent < left) {
            c->offset += (Py_ssize_t)sent;
            return;
        }
        sent -= left;
        c->index++;
        c->offset = 0;
    }
}

/* Non-blocking sends until the socket is full or everything is sent: bytes sent, or -1 with
 * errno set when the connection failed. */
static Py_ssize_t
send_ready(int fd, cursor_t *c, size_t limit, size_t batch)
{
    struct iovec iov[MAX_IOV];
    Py_ssize_t total = 0;
    for (;;) {
        if ((size_t)total >= limit)
            return total;
        size_t want = limit - (size_t)total;
        int n = fill_iov(c, iov, want < batch ? want : batch);
        if (n == 0)
            return total;
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)n;
        ssize_t sent = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return total;
            return -1;
        }
        advance(c, (size_t)sent);
        total += sent;
    }
}

/* The parts' buffers (each held: PyBUF_SIMPLE), or NULL with an exception set. */
static Py_buffer *
get_buffers(PyObject *parts, Py_ssize_t *count)
{
    if (!PyList_Check(parts)) {
        PyErr_SetString(PyExc_TypeError, "parts must be a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(parts);
    Py_buffer *bufs = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_buffer));
    if (bufs == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(parts, i), &bufs[i], PyBUF_SIMPLE) < 0) {
            for (Py_ssize_t j = 0; j < i; j++)
                PyBuffer_Release(&bufs[j]);
            PyMem_Free(bufs);
            return NULL;
        }
    }
    *count = n;
    return bufs;
}

static void
release_buffers(Py_buffer *bufs, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++)
        PyBuffer_Release(&bufs[i]);
    PyMem_Free(bufs);
}

static PyObject *
send_now(PyObject *module, PyObject *args)
{
    int fd;
    PyObject *parts;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "iOn:send_now", &fd, &parts, &limit))
        return NULL;
    cursor_t c = {NULL, 0, 0, 0};
    c.bufs = get_buffers(parts, &c.count);
    if (c.bufs == NULL)
        return NULL;
    /* the GIL kept: nothing here can block */
    Py_ssize_t sent = send_ready(fd, &c, limit < 0 ? 0 : (size_t)limit, SIZE_MAX);
    int err = errno;
    release_buffers(c.bufs, c.count);
    if (sent < 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(sent);
}

/* --- Send: the rest, from a native thread ------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    cursor_t cursor;
    PyObject *parts;      /* kept alive with the buffers */
    int sock;             /* the thread's duplicate of the connection's descriptor */
    int event;            /* eventfd: readable when the thread is done */
    long long budget_ms;
    pthread_t thread;
    int started;          /* a thread to join */
    int joined;
    volatile sig_atomic_t stop;
    volatile sig_atomic_t done;  /* the thread has sent what it will */
    Py_ssize_t sent;      /* written by the thread, read after the eventfd says done */
    int error;
} SendObject;

static long long
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *
send_thread(void *arg)
{
    SendObject *self = arg;
    long long deadline = now_ms() + self->budget_ms;
    struct pollfd pfd = {self->sock, POLLOUT, 0};
    while (!self->stop && self->cursor.index < self->cursor.count) {
        Py_ssize_t sent = send_ready(self->sock, &self->cursor, SIZE_MAX, BATCH);
        if (sent < 0) {
            self->error = errno;
            break;
        }
        self->sent += sent;
        if (self->cursor.index >= self->cursor.count)
            break;
        long long left = deadline - now_ms();
        if (left <= 0)
            break;  /* the client is slow: the rest goes back to the loop */
        if (poll(&pfd, 1, (int)(left < POLL_SLICE_MS ? left : POLL_SLICE_MS)) < 0
                && errno != EINTR) {
            self->error = errno;
            break;
        }
    }
    close(self->sock);
    self->sock = -1;
    self->done = 1;
    uint64_t one = 1;
    while (write(self->event, &one, sizeof one) < 0 && errno == EINTR)
        ;
    return NULL;
}

static void
join_thread(SendObject *self)
{
    if (self->started && !self->joined) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(self->thread, NULL);
        Py_END_ALLOW_THREADS
        self->joined = 1;
    }
}

static void
send_clear(SendObject *self)
{
    if (self->cursor.bufs != NULL) {
        release_buffers(self->cursor.bufs, self->cursor.count);
        self->cursor.bufs = NULL;
    }
    Py_CLEAR(self->parts);
    if (self->event >= 0) {
        close(self->event);
        self->event = -1;
    }
    if (self->sock >= 0) {
        close(self->sock);
        self->sock = -1;
    }
}

static int
Send_init(SendObject *self, PyObject *args, PyObject *kwds)
{
    int fd;
    PyObject *parts;
    double seconds;
    static char *kwlist[] = {"fd", "parts", "seconds", NULL};
    if (self->parts != NULL || self->started) {
        PyErr_SetString(PyExc_RuntimeError, "Send is not reusable");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOd:Send", kwlist, &fd, &parts, &seconds))
        return -1;
    self->cursor.bufs = get_buffers(parts, &self->cursor.count);
    if (self->cursor.bufs == NULL)
        return -1;
    Py_INCREF(parts);
    self->parts = parts;
    self->budget_ms = (long long)(seconds * 1000);
    self->sock = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (self->sock < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        send_clear(self);
        return -1;
    }
    self->event = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (self->event < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        send_clear(self);
        return -1;
    }
    /* Signals are for the interpreter's threads: the new thread starts with all blocked. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&self->thread, NULL, send_thread, self);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        errno = rc;
        PyErr_SetFromErrno(PyExc_OSError);
        send_clear(self);
        return -1;
    }
    self->started = 1;
    return 0;
}

static PyObject *
Send_fileno(SendObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->event < 0) {
        PyErr_SetString(PyExc_ValueError, "Send is finished");
        return NULL;
    }
    return PyLong_FromLong(self->event);
}

static PyObject *
Send_finish(SendObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!self->started) {
        PyErr_SetString(PyExc_ValueError, "Send was not started");
        return NULL;
    }
    join_thread(self);
    send_clear(self);
    return Py_BuildValue("(ni)", self->sent, self->error);
}

static PyObject *
Send_running(SendObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->started && !self->done);
}

static PyGetSetDef Send_getset[] = {
    {"running", (getter)Send_running, NULL, "The thread is still sending.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static void
Send_dealloc(SendObject *self)
{
    self->stop = 1;
    join_thread(self);  /* the buffers must outlive the thread */
    send_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Send_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    SendObject *self = (SendObject *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->sock = -1;
        self->event = -1;
    }
    return (PyObject *)self;
}

static PyMethodDef Send_methods[] = {
    {"fileno", (PyCFunction)Send_fileno, METH_NOARGS,
     "The eventfd that becomes readable when the thread is done."},
    {"finish", (PyCFunction)Send_finish, METH_NOARGS,
     "(bytes sent, errno or 0): joins the thread, lets the buffers go."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SendType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "exporters._sendbody.Send",
    .tp_basicsize = sizeof(SendObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Send(fd, parts, seconds): the rest of a body, from a native thread.",
    .tp_new = Send_new,
    .tp_init = (initproc)Send_init,
    .tp_dealloc = (destructor)Send_dealloc,
    .tp_methods = Send_methods,
    .tp_getset = Send_getset,
};

static PyMethodDef module_methods[] = {
    {"send_now", send_now, METH_VARARGS,
     "send_now(fd, parts, limit) -> bytes the non-blocking socket took at once (GIL held)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "exporters._sendbody",
    "Big response bodies sent without the GIL changing hands.", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__sendbody(void)
{
    if (PyType_Ready(&SendType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SendType);
    if (PyModule_AddObject(m, "Send", (PyObject *)&SendType) < 0) {
        Py_DECREF(&SendType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
