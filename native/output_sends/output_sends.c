/* Sends on a pulsar-client producer in one call, through the C API of the client's library.
 *
 * pulsar-client's Producer.send_async checks its arguments in Python and builds the message in
 * a call into the C++ binding per field and property. Sender.send_async takes the same
 * arguments and does it all here: libpulsar's C API (pulsar_message_*,
 * pulsar_producer_send_async), reached through the already loaded _pulsar module, on the C++
 * producer that pybind11's conduit (_pybind11_conduit_v1_) hands out. The C API's producer
 * struct holds only that C++ producer, so the C++ producer's address is the C API's producer
 * (checked: the C API must name the producer's topic as the binding does).
 *
 * A callback gets (result, None): no message id. Content other than bytes, an argument of
 * another type, a property with a NUL in it, or any other keyword is not sent: send_async
 * returns NotImplemented, and the caller sends it through the Python producer, which checks
 * it as it always did. See magnetar/instance/native_sends.py.
 *
 * send_recorded sends the same way, but its outcome is not a Python callback: the client's
 * I/O thread records (token, result) in a Ledger, without the GIL, and the instance's thread
 * takes what was recorded. A callback in Python made the I/O thread take the GIL and create
 * and destroy a Python thread state, with a 16 KiB frame stack mapped and unmapped, for every
 * chunk. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef struct c_message c_message;
typedef struct c_producer c_producer;
typedef struct c_message_id c_message_id;
typedef void (*c_send_callback)(int result, c_message_id *id, void *context);

static c_message *(*message_create)(void);
static void (*message_free)(c_message *);
static void (*message_set_content)(c_message *, const void *, size_t);
static void (*message_set_property)(c_message *, const char *, const char *);
static void (*message_set_event_timestamp)(c_message *, uint64_t);
static void (*message_set_sequence_id)(c_message *, int64_t);
static void (*message_set_partition_key)(c_message *, const char *);
static void (*message_set_ordering_key)(c_message *, const char *);
static void (*producer_send_async)(c_producer *, c_message *, c_send_callback, void *);
static void (*message_id_free)(c_message_id *);
static const char *(*producer_get_topic)(c_producer *);
static void (*producer_flush_async)(c_producer *, void (*)(int, void *), void *);
static void *producer_type_info; /* the C++ std::type_info of pulsar::Producer */
static PyObject *result_type;    /* _pulsar.Result */

/* The ABI the wheel's pybind11 was built for (checked by the conduit, which declines
 * another); the pointer is only ever handed back to the same wheel's library. */
static const char PLATFORM_ABI_ID[] = "system_libstdcpp_gxx_abi_1xxx_use_cxx11_abi_1";

/* On the client's I/O thread. The C API allocates a message id for every successful send. */
static void on_sent(int result, c_message_id *id, void *callback) {
    if (id) message_id_free(id);
    if (!callback) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *code = PyObject_CallFunction(result_type, "i", result);
    PyObject *returned =
        code ? PyObject_CallFunctionObjArgs((PyObject *)callback, code, Py_None, NULL) : NULL;
    if (!returned) PyErr_WriteUnraisable((PyObject *)callback);
    Py_XDECREF(returned);
    Py_XDECREF(code);
    Py_DECREF((PyObject *)callback);
    PyGILState_Release(gil);
}

/* --- Ledger: outcomes recorded on the I/O thread, taken on the instance's --------------- */

typedef struct Ledger Ledger;

typedef struct Outcome {
    struct Outcome *next;
    Ledger *ledger; /* a reference, held until the outcome is taken */
    PyObject *token;
    int result;
} Outcome;

struct Ledger {
    PyObject_HEAD
    pthread_mutex_t lock;
    pthread_cond_t changed; /* on CLOCK_MONOTONIC */
    Outcome *first, *last;
    int notified;
};

static PyTypeObject LedgerType;

static PyObject *Ledger_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args) || (kwargs && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "Ledger() takes no arguments");
        return NULL;
    }
    Ledger *self = (Ledger *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_mutex_init(&self->lock, NULL);
    pthread_cond_init(&self->changed, &monotonic);
    pthread_condattr_destroy(&monotonic);
    return (PyObject *)self;
}

/* Only once nothing is in flight: every outcome holds a reference to its ledger. */
static void Ledger_dealloc(Ledger *self) {
    pthread_cond_destroy(&self->changed);
    pthread_mutex_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* On the client's I/O thread, without the GIL. */
static void on_recorded(int result, c_message_id *id, void *context) {
    if (id) message_id_free(id);
    Outcome *outcome = context;
    Ledger *ledger = outcome->ledger;
    outcome->result = result;
    pthread_mutex_lock(&ledger->lock);
    if (ledger->last)
        ledger->last->next = outcome;
    else
        ledger->first = outcome;
    ledger->last = outcome;
    pthread_cond_signal(&ledger->changed);
    pthread_mutex_unlock(&ledger->lock);
}

/* take(): [(token, pulsar.Result)] recorded so far, in the order they came. */
static PyObject *Ledger_take(Ledger *self, PyObject *unused) {
    (void)unused;
    pthread_mutex_lock(&self->lock);
    Outcome *outcome = self->first;
    self->first = self->last = NULL;
    pthread_mutex_unlock(&self->lock);
    PyObject *taken = PyList_New(0);
    while (outcome) {
        Outcome *next = outcome->next;
        PyObject *result = taken ? PyObject_CallFunction(result_type, "i", outcome->result) : NULL;
        PyObject *pair = result ? PyTuple_Pack(2, outcome->token, result) : NULL;
        if (!pair || PyList_Append(taken, pair) < 0) Py_CLEAR(taken);
        Py_XDECREF(pair);
        Py_XDECREF(result);
        Py_DECREF(outcome->token);
        Py_DECREF(outcome->ledger);
        PyMem_RawFree(outcome);
        outcome = next;
    }
    return taken;
}

/* wait(timeout_s): until an outcome is recorded or notify() is called (since the last wait
 * returned), or timeout_s passes; True if one of the first two. */
static PyObject *Ledger_wait(Ledger *self, PyObject *arg) {
    double timeout_s = PyFloat_AsDouble(arg);
    if (timeout_s == -1.0 && PyErr_Occurred()) return NULL;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    double whole = timeout_s > 0 ? (timeout_s < 1e6 ? timeout_s : 1e6) : 0;
    until.tv_sec += (time_t)whole;
    until.tv_nsec += (long)((whole - (double)(time_t)whole) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec += 1;
        until.tv_nsec -= 1000000000L;
    }
    int woken;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    int status = 0;
    while (!self->first && !self->notified && status != ETIMEDOUT)
        status = pthread_cond_timedwait(&self->changed, &self->lock, &until);
    woken = self->first || self->notified;
    self->notified = 0;
    pthread_mutex_unlock(&self->lock);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(woken);
}

/* notify(): wake a wait() (an outcome that came through a Python callback instead). */
static PyObject *Ledger_notify(Ledger *self, PyObject *unused) {
    (void)unused;
    pthread_mutex_lock(&self->lock);
    self->notified = 1;
    pthread_cond_signal(&self->changed);
    pthread_mutex_unlock(&self->lock);
    Py_RETURN_NONE;
}

static PyMethodDef Ledger_methods[] = {
    {"take", (PyCFunction)Ledger_take, METH_NOARGS,
     "The (token, result) pairs recorded so far, in order; they are taken."},
    {"wait", (PyCFunction)Ledger_wait, METH_O,
     "wait(timeout_s): until an outcome is recorded or notify() is called; True if so."},
    {"notify", (PyCFunction)Ledger_notify, METH_NOARGS, "Wake a wait()."},
    {NULL},
};

static PyTypeObject LedgerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "magnetar.instance._output_sends.Ledger",
    .tp_basicsize = sizeof(Ledger),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The outcomes of send_recorded, recorded without the GIL.",
    .tp_new = Ledger_new,
    .tp_dealloc = (destructor)Ledger_dealloc,
    .tp_methods = Ledger_methods,
};

/* --- Sender ------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *binding; /* the pulsar.Producer's _pulsar.Producer, which holds the C++ producer */
    c_producer *native;
} Sender;

static int Sender_init(Sender *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"producer", NULL};
    PyObject *producer;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:Sender", keywords, &producer)) return -1;
    PyObject *binding = PyObject_GetAttrString(producer, "_producer");
    if (!binding) return -1;
    PyObject *type_info = PyCapsule_New(producer_type_info, "St9type_info", NULL);
    PyObject *conduit = type_info ? PyObject_CallMethod(binding, "_pybind11_conduit_v1_", "yOy",
                                                        PLATFORM_ABI_ID, type_info,
                                                        "raw_pointer_ephemeral")
                                  : NULL;
    Py_XDECREF(type_info);
    if (!conduit) {
        Py_DECREF(binding);
        return -1;
    }
    void *native = conduit == Py_None ? NULL : PyCapsule_GetPointer(conduit, "N6pulsar8ProducerE");
    Py_DECREF(conduit);
    PyObject *topic = native ? PyObject_CallMethod(binding, "topic", NULL) : NULL;
    const char *expected = topic ? PyUnicode_AsUTF8(topic) : NULL;
    if (!expected || strcmp(expected, producer_get_topic(native)) != 0) native = NULL;
    Py_XDECREF(topic);
    if (!native) {
        Py_DECREF(binding);
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "the producer's binding does not hand out its C++ producer");
        return -1;
    }
    Py_XSETREF(self->binding, binding);
    self->native = native;
    return 0;
}

static void Sender_dealloc(Sender *self) {
    Py_XDECREF(self->binding);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A str without NUL as UTF-8 (NULL, no error set, for anything else). */
static const char *text(PyObject *value) {
    Py_ssize_t size;
    const char *utf8 = PyUnicode_Check(value) ? PyUnicode_AsUTF8AndSize(value, &size) : NULL;
    if (!utf8 || strlen(utf8) != (size_t)size) {
        PyErr_Clear();
        return NULL;
    }
    return utf8;
}

/* Fills message from the keywords; 0 when one is not for this path. */
static int fill(c_message *message, PyObject *const *values, PyObject *names) {
    Py_ssize_t count = names ? PyTuple_GET_SIZE(names) : 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(names, i));
        PyObject *value = values[i];
        if (!name) {
            PyErr_Clear();
            return 0;
        }
        if (value == Py_None) continue;
        if (strcmp(name, "properties") == 0) {
            if (!PyDict_CheckExact(value)) return 0;
            Py_ssize_t at = 0;
            PyObject *key, *item;
            while (PyDict_Next(value, &at, &key, &item)) {
                const char *k = text(key), *v = text(item);
                if (!k || !v) return 0;
                message_set_property(message, k, v);
            }
        } else if (strcmp(name, "event_timestamp") == 0 || strcmp(name, "sequence_id") == 0) {
            if (!PyLong_CheckExact(value)) return 0;
            int overflow;
            long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
            if (overflow || number < 0) return 0;
            if (number == 0) continue; /* as pulsar-client: 0 sets neither */
            if (name[0] == 'e')
                message_set_event_timestamp(message, (uint64_t)number);
            else
                message_set_sequence_id(message, number);
        } else if (strcmp(name, "partition_key") == 0 || strcmp(name, "ordering_key") == 0) {
            const char *key = text(value);
            if (!key) return 0;
            if (!*key) continue; /* as pulsar-client: an empty key is no key */
            (name[0] == 'p' ? message_set_partition_key : message_set_ordering_key)(message, key);
        } else {
            return 0;
        }
    }
    return 1;
}

/* Builds the message from content and the keywords and sends it, the outcome to
 * callback(context); 0, nothing sent, when the content or a keyword is not for this path. */
static int send_built(Sender *self, PyObject *content, PyObject *const *values, PyObject *names,
                      c_send_callback callback, void *context) {
    c_message *message = PyBytes_CheckExact(content) ? message_create() : NULL;
    if (!message) return 0;
    if (!fill(message, values, names)) {
        message_free(message);
        return 0;
    }
    message_set_content(message, PyBytes_AS_STRING(content), PyBytes_GET_SIZE(content));
    Py_BEGIN_ALLOW_THREADS /* blocks while the producer's queue is full */
    producer_send_async(self->native, message, callback, context);
    Py_END_ALLOW_THREADS
    message_free(message);
    return 1;
}

/* send_async(content, callback, **message fields) */
static PyObject *Sender_send_async(Sender *self, PyObject *const *args, size_t nargsf,
                                   PyObject *names) {
    if (PyVectorcall_NARGS(nargsf) != 2) {
        PyErr_SetString(PyExc_TypeError, "send_async(content, callback, **fields)");
        return NULL;
    }
    PyObject *callback = args[1] == Py_None ? NULL : args[1];
    Py_XINCREF(callback);
    if (send_built(self, args[0], args + 2, names, on_sent, callback)) Py_RETURN_NONE;
    Py_XDECREF(callback);
    Py_RETURN_NOTIMPLEMENTED;
}

/* send_recorded(content, ledger, token, **message fields): as send_async, the outcome
 * recorded in ledger as (token, result). */
static PyObject *Sender_send_recorded(Sender *self, PyObject *const *args, size_t nargsf,
                                      PyObject *names) {
    if (PyVectorcall_NARGS(nargsf) != 3 || !PyObject_TypeCheck(args[1], &LedgerType)) {
        PyErr_SetString(PyExc_TypeError, "send_recorded(content, ledger, token, **fields)");
        return NULL;
    }
    Outcome *outcome = PyMem_RawCalloc(1, sizeof(Outcome));
    if (!outcome) return PyErr_NoMemory();
    outcome->ledger = (Ledger *)Py_NewRef(args[1]);
    outcome->token = Py_NewRef(args[2]);
    if (send_built(self, args[0], args + 3, names, on_recorded, outcome)) Py_RETURN_NONE;
    Py_DECREF(outcome->token);
    Py_DECREF(outcome->ledger);
    PyMem_RawFree(outcome);
    Py_RETURN_NOTIMPLEMENTED;
}

/* flush_async(): the open batch goes out now. With the GIL released, unlike the binding's
 * flush_async, which holds it while it waits for the producer's lock: the I/O thread can hold
 * that lock while it waits for the GIL to run a send callback. Its outcome comes with the
 * sends' callbacks. */
static PyObject *Sender_flush_async(Sender *self, PyObject *unused) {
    (void)unused;
    Py_BEGIN_ALLOW_THREADS
    producer_flush_async(self->native, NULL, NULL);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef Sender_methods[] = {
    {"send_async", (PyCFunction)(void (*)(void))Sender_send_async,
     METH_FASTCALL | METH_KEYWORDS, "Send as pulsar.Producer.send_async does, or return NotImplemented."},
    {"send_recorded", (PyCFunction)(void (*)(void))Sender_send_recorded,
     METH_FASTCALL | METH_KEYWORDS,
     "As send_async, its outcome recorded in a Ledger as (token, result)."},
    {"flush_async", (PyCFunction)Sender_flush_async, METH_NOARGS,
     "Send the open batch now; returns at once."},
    {NULL},
};

static PyTypeObject SenderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "magnetar.instance._output_sends.Sender",
    .tp_basicsize = sizeof(Sender),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Sends on a pulsar.Producer through the client library's C API.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Sender_init,
    .tp_dealloc = (destructor)Sender_dealloc,
    .tp_methods = Sender_methods,
};

/* Every symbol from the loaded _pulsar module and the libpulsar it depends on. */
static int bind_client(void) {
    PyObject *binding = PyImport_ImportModule("_pulsar");
    if (!binding) return -1;
    result_type = PyObject_GetAttrString(binding, "Result");
    PyObject *file = PyObject_GetAttrString(binding, "__file__");
    Py_DECREF(binding);
    const char *path = file ? PyUnicode_AsUTF8(file) : NULL;
    void *library = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
    Py_XDECREF(file);
    if (!result_type || !path) return -1;
    if (!library) {
        PyErr_Format(PyExc_ImportError, "cannot open pulsar-client's binding: %s", dlerror());
        return -1;
    }
    struct {
        void **slot;
        const char *name;
    } symbols[] = {
        {(void **)&message_create, "pulsar_message_create"},
        {(void **)&message_free, "pulsar_message_free"},
        {(void **)&message_set_content, "pulsar_message_set_content"},
        {(void **)&message_set_property, "pulsar_message_set_property"},
        {(void **)&message_set_event_timestamp, "pulsar_message_set_event_timestamp"},
        {(void **)&message_set_sequence_id, "pulsar_message_set_sequence_id"},
        {(void **)&message_set_partition_key, "pulsar_message_set_partition_key"},
        {(void **)&message_set_ordering_key, "pulsar_message_set_ordering_key"},
        {(void **)&producer_send_async, "pulsar_producer_send_async"},
        {(void **)&message_id_free, "pulsar_message_id_free"},
        {(void **)&producer_get_topic, "pulsar_producer_get_topic"},
        {(void **)&producer_flush_async, "pulsar_producer_flush_async"},
        {&producer_type_info, "_ZTIN6pulsar8ProducerE"},
    };
    for (size_t i = 0; i < sizeof symbols / sizeof *symbols; i++) {
        *symbols[i].slot = dlsym(library, symbols[i].name);
        if (!*symbols[i].slot) {
            PyErr_Format(PyExc_ImportError, "pulsar-client's library has no %s", symbols[i].name);
            return -1;
        }
    }
    return 0;
}

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_output_sends", "Sends through pulsar-client's C API.", -1, NULL,
};

PyMODINIT_FUNC PyInit__output_sends(void) {
    if (PyType_Ready(&SenderType) < 0 || PyType_Ready(&LedgerType) < 0 || bind_client() < 0)
        return NULL;
    PyObject *created = PyModule_Create(&module);
    if (created && (PyModule_AddObjectRef(created, "Sender", (PyObject *)&SenderType) < 0 ||
                    PyModule_AddObjectRef(created, "Ledger", (PyObject *)&LedgerType) < 0))
        Py_CLEAR(created);
    return created;
}
