/* The recorder's per-node hot path in C: edbatch.api._fastrec (optional; see _fast.py).
 *
 * An OpCall wraps the Python function that records one node of an op type or cell (the
 * closures of _builtins.py and _cellcall.py, its twin): it takes the common case itself
 * (operands that are Handles of the batch's current Recording, of the registered row shapes
 * where the cell has them, the attr as the Python function accepts it inline, the node's
 * pooled handle present) and appends to the recording's lists exactly what the Python
 * function appends; anything else is passed on to the Python function unchanged, which
 * records it or raises its usual error. AddLoss does the same for DynamicBatch.add_loss.
 *
 * Handles, kinds and recordings are Python classes with __slots__: setup() reads each slot's
 * offset from its member descriptor once, and the calls read and write the slots there.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef Py_T_OBJECT_EX
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif
#ifndef Py_READONLY
#define Py_READONLY READONLY
#endif

static PyTypeObject *HandleType, *KindType, *RecordingType, *CurrentType;
static Py_ssize_t off_h_rec, off_h_kind, off_h_node;  /* Handle */
static Py_ssize_t off_k_shape, off_k_scalar, off_k_op_id;  /* Kind */
/* Recording */
static Py_ssize_t off_r_ops, off_r_operands, off_r_attrs, off_r_losses, off_r_counts;
static Py_ssize_t off_c_rec;  /* Current */
static PyObject *str_attr, *str_num_embeddings, *minus_one;
static int ready;

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

static int
slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *out)
{
    PyObject *d = PyDict_GetItemString(type->tp_dict, name);  /* borrowed */
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, "_fastrec.setup: %s.%s is not a __slots__ member",
                     type->tp_name, name);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != Py_T_OBJECT_EX || (m->flags & Py_READONLY)) {
        PyErr_Format(PyExc_TypeError, "_fastrec.setup: %s.%s is not a writable object slot",
                     type->tp_name, name);
        return -1;
    }
    *out = m->offset;
    return 0;
}

static PyObject *
fastrec_setup(PyObject *module, PyObject *args)
{
    PyTypeObject *h, *k, *r, *c;
    if (!PyArg_ParseTuple(args, "O!O!O!O!:setup", &PyType_Type, &h, &PyType_Type, &k,
                          &PyType_Type, &r, &PyType_Type, &c))
        return NULL;
    if (slot_offset(h, "_rec", &off_h_rec) || slot_offset(h, "_kind", &off_h_kind) ||
        slot_offset(h, "node_id", &off_h_node) || slot_offset(k, "shape", &off_k_shape) ||
        slot_offset(k, "scalar", &off_k_scalar) || slot_offset(k, "op_id", &off_k_op_id) ||
        slot_offset(r, "ops", &off_r_ops) || slot_offset(r, "counts", &off_r_counts) ||
        slot_offset(r, "operands", &off_r_operands) || slot_offset(r, "attrs", &off_r_attrs) ||
        slot_offset(r, "losses", &off_r_losses) || slot_offset(c, "rec", &off_c_rec))
        return NULL;
    Py_INCREF(h); Py_INCREF(k); Py_INCREF(r); Py_INCREF(c);
    Py_XSETREF(HandleType, h);
    Py_XSETREF(KindType, k);
    Py_XSETREF(RecordingType, r);
    Py_XSETREF(CurrentType, c);
    ready = 1;
    Py_RETURN_NONE;
}

/* The batch's current Recording (borrowed: the Current holds it), or NULL to fall back. */
static inline PyObject *
current_recording(PyObject *current)
{
    PyObject *rec;
    if (!Py_IS_TYPE(current, CurrentType))
        return NULL;
    rec = SLOT(current, off_c_rec);
    return rec != NULL && Py_IS_TYPE(rec, RecordingType) ? rec : NULL;
}

static inline int
is_list(PyObject *o)
{
    return o != NULL && PyList_CheckExact(o);
}

/* ------------------------------------------------------------------------------- OpCall */
enum { ATTR_ANY = 0, ATTR_INT = 1, ATTR_NONE = 2, ATTR_COUNT = 3 };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *current;   /* the batch's Current: its recording, read per call */
    PyObject *kind;      /* the op type's Kind, set on the node's handle */
    PyObject *op_id;     /* int appended to rec.ops */
    PyObject *pool;      /* batch._pool: node id -> handle */
    PyObject *fallback;  /* the Python function: everything but the common case */
    PyObject *shapes;    /* tuple of interned row shapes per operand, or None (no check) */
    PyObject *each;      /* a variadic cell's repeated row shape (None: not checked) */
    Py_ssize_t arity;    /* operands; a variadic op's fixed ones (any number more follow) */
    int variadic;        /* whether the node's operand count goes to rec.counts */
    int attr_mode;       /* ATTR_ANY: any attr, default -1; ATTR_INT: an exact int is
                            required; ATTR_NONE: none or None, recorded as -1; ATTR_COUNT:
                            none, the repeated operands' count recorded (variadic cells) */
} OpCall;

static PyObject *
opcall_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    OpCall *self = (OpCall *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), i;
    PyObject *attr = NULL, *rec, *ops, *operands, *attrs, *h, *old;

    if (!ready || (self->variadic ? nargs < self->arity : nargs != self->arity))
        goto fallback;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        if (PyTuple_GET_SIZE(kwnames) != 1 || PyTuple_GET_ITEM(kwnames, 0) != str_attr)
            goto fallback;  /* (a keyword not interned as "attr" takes the Python path) */
        attr = args[nargs];
    }
    switch (self->attr_mode) {
    case ATTR_ANY:
        if (attr == NULL)
            attr = minus_one;
        break;
    case ATTR_INT:
        if (attr == NULL || !PyLong_CheckExact(attr))
            goto fallback;
        break;
    case ATTR_NONE:
        if (attr != NULL && attr != Py_None)
            goto fallback;
        attr = minus_one;
        break;
    default:
        if (attr != NULL)
            goto fallback;
    }
    rec = current_recording(self->current);
    if (rec == NULL)
        goto fallback;
    for (i = 0; i < nargs; i++) {
        PyObject *a = args[i];
        if (!Py_IS_TYPE(a, HandleType) || SLOT(a, off_h_rec) != rec ||
            SLOT(a, off_h_node) == NULL)
            goto fallback;
        if (self->shapes != Py_None) {
            PyObject *k = SLOT(a, off_h_kind);
            if (k == NULL || !Py_IS_TYPE(k, KindType) || SLOT(k, off_k_shape) !=
                (i < self->arity ? PyTuple_GET_ITEM(self->shapes, i) : self->each))
                goto fallback;
        }
    }
    ops = SLOT(rec, off_r_ops);
    operands = SLOT(rec, off_r_operands);
    attrs = SLOT(rec, off_r_attrs);
    if (!is_list(ops) || !is_list(operands) || !is_list(attrs) ||
        (self->variadic && !is_list(SLOT(rec, off_r_counts))) ||
        PyList_GET_SIZE(ops) >= PyList_GET_SIZE(self->pool))
        goto fallback;  /* (a pool too short: the Python function grows it) */
    h = PyList_GET_ITEM(self->pool, PyList_GET_SIZE(ops));
    if (!Py_IS_TYPE(h, HandleType))
        goto fallback;
    if (PyList_Append(ops, self->op_id) < 0)
        goto error;
    for (i = 0; i < nargs; i++)
        if (PyList_Append(operands, SLOT(args[i], off_h_node)) < 0)
            goto error;
    if (self->variadic) {
        PyObject *count = PyLong_FromSsize_t(nargs);
        int bad = count == NULL || PyList_Append(SLOT(rec, off_r_counts), count) < 0;
        Py_XDECREF(count);
        if (bad)
            goto error;
    }
    if (self->attr_mode == ATTR_COUNT) {
        PyObject *repeated = PyLong_FromSsize_t(nargs - self->arity);
        int bad = repeated == NULL || PyList_Append(attrs, repeated) < 0;
        Py_XDECREF(repeated);
        if (bad)
            goto error;
    } else if (PyList_Append(attrs, attr) < 0)
        goto error;
    Py_INCREF(h);
    old = SLOT(h, off_h_rec);
    Py_INCREF(rec);
    SLOT(h, off_h_rec) = rec;
    Py_XDECREF(old);
    old = SLOT(h, off_h_kind);
    Py_INCREF(self->kind);
    SLOT(h, off_h_kind) = self->kind;
    Py_XDECREF(old);
    return h;

error:
    return NULL;
fallback:
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *
opcall_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"current", "kind", "op_id", "pool", "fallback", "shapes", "arity",
                            "attr_mode", "variadic", "each", NULL};
    PyObject *current, *kind, *op_id, *pool, *fallback, *shapes, *each = Py_None;
    Py_ssize_t arity;
    int attr_mode, variadic = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO!O!OOni|pO:OpCall", names, &current, &kind,
                                     &PyLong_Type, &op_id, &PyList_Type, &pool, &fallback,
                                     &shapes, &arity, &attr_mode, &variadic, &each))
        return NULL;
    if (arity < 0 || attr_mode < ATTR_ANY || attr_mode > ATTR_COUNT ||
        (attr_mode == ATTR_COUNT) != (variadic && shapes != Py_None) ||
        !PyCallable_Check(fallback) || (shapes != Py_None && (!PyTuple_CheckExact(shapes) ||
                                                              PyTuple_GET_SIZE(shapes) != arity))) {
        PyErr_SetString(PyExc_ValueError, "OpCall: arity >= 0, attr_mode 0-3 (3 exactly for "
                        "a variadic cell), a callable fallback and shapes None or a tuple of "
                        "arity shapes");
        return NULL;
    }
    OpCall *self = (OpCall *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = opcall_vectorcall;
    Py_INCREF(current); self->current = current;
    Py_INCREF(kind); self->kind = kind;
    Py_INCREF(op_id); self->op_id = op_id;
    Py_INCREF(pool); self->pool = pool;
    Py_INCREF(fallback); self->fallback = fallback;
    Py_INCREF(shapes); self->shapes = shapes;
    Py_INCREF(each); self->each = each;
    self->variadic = variadic;
    self->arity = arity;
    self->attr_mode = attr_mode;
    return (PyObject *)self;
}

static int
opcall_traverse(OpCall *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dict);
    Py_VISIT(self->current);
    Py_VISIT(self->kind);
    Py_VISIT(self->op_id);
    Py_VISIT(self->pool);
    Py_VISIT(self->fallback);
    Py_VISIT(self->shapes);
    Py_VISIT(self->each);
    return 0;
}

static int
opcall_clear(OpCall *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->current);
    Py_CLEAR(self->kind);
    Py_CLEAR(self->op_id);
    Py_CLEAR(self->pool);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->shapes);
    Py_CLEAR(self->each);
    return 0;
}

static void
opcall_dealloc(OpCall *self)
{
    PyObject_GC_UnTrack(self);
    opcall_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
call_repr(PyObject *self)
{
    PyObject *name = PyObject_GetAttrString(self, "__name__"), *out;
    if (name == NULL) {
        PyErr_Clear();
        return PyUnicode_FromFormat("<%s object at %p>", Py_TYPE(self)->tp_name, self);
    }
    out = PyUnicode_FromFormat("<recording function %S>", name);
    Py_DECREF(name);
    return out;
}

static PyMemberDef opcall_members[] = {
    {"fallback", T_OBJECT, offsetof(OpCall, fallback), READONLY,
     "the Python function this call passes everything but the common case to"},
    {NULL}
};

static PyGetSetDef call_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL}
};

static PyTypeObject OpCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "edbatch.api._fastrec.OpCall",
    .tp_doc = "One node of an op type or cell per call (the common case in C; see the "
              "module).",
    .tp_basicsize = sizeof(OpCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = opcall_new,
    .tp_dealloc = (destructor)opcall_dealloc,
    .tp_traverse = (traverseproc)opcall_traverse,
    .tp_clear = (inquiry)opcall_clear,
    .tp_vectorcall_offset = offsetof(OpCall, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dictoffset = offsetof(OpCall, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = opcall_members,
    .tp_getset = call_getset,
    .tp_repr = call_repr,
};

/* ------------------------------------------------------------------------------ AddLoss */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *current;   /* the batch's Current */
    PyObject *fallback;  /* the bound DynamicBatch.add_loss */
} AddLoss;

static PyObject *
addloss_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    AddLoss *self = (AddLoss *)op;
    PyObject *rec, *h, *k, *losses;
    if (!ready || PyVectorcall_NARGS(nargsf) != 1 ||
        (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0))
        goto fallback;
    rec = current_recording(self->current);
    if (rec == NULL)
        goto fallback;
    h = args[0];
    if (!Py_IS_TYPE(h, HandleType) || SLOT(h, off_h_rec) != rec ||
        SLOT(h, off_h_node) == NULL || (k = SLOT(h, off_h_kind)) == NULL ||
        !Py_IS_TYPE(k, KindType) || SLOT(k, off_k_scalar) != Py_True)
        goto fallback;
    losses = SLOT(rec, off_r_losses);
    if (!is_list(losses))
        goto fallback;
    if (PyList_Append(losses, SLOT(h, off_h_node)) < 0)
        return NULL;
    Py_RETURN_NONE;
fallback:
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *
addloss_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"current", "fallback", NULL};
    PyObject *current, *fallback;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:AddLoss", names, &current, &fallback))
        return NULL;
    AddLoss *self = (AddLoss *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = addloss_vectorcall;
    Py_INCREF(current); self->current = current;
    Py_INCREF(fallback); self->fallback = fallback;
    return (PyObject *)self;
}

static int
addloss_traverse(AddLoss *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dict);
    Py_VISIT(self->current);
    Py_VISIT(self->fallback);
    return 0;
}

static int
addloss_clear(AddLoss *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->current);
    Py_CLEAR(self->fallback);
    return 0;
}

static void
addloss_dealloc(AddLoss *self)
{
    PyObject_GC_UnTrack(self);
    addloss_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef addloss_members[] = {
    {"fallback", T_OBJECT, offsetof(AddLoss, fallback), READONLY,
     "the bound DynamicBatch.add_loss this call passes everything but the common case to"},
    {NULL}
};

static PyTypeObject AddLossType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "edbatch.api._fastrec.AddLoss",
    .tp_doc = "DynamicBatch.add_loss with the common case in C (see the module).",
    .tp_basicsize = sizeof(AddLoss),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = addloss_new,
    .tp_dealloc = (destructor)addloss_dealloc,
    .tp_traverse = (traverseproc)addloss_traverse,
    .tp_clear = (inquiry)addloss_clear,
    .tp_vectorcall_offset = offsetof(AddLoss, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dictoffset = offsetof(AddLoss, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = addloss_members,
    .tp_getset = call_getset,
    .tp_repr = call_repr,
};

/* ------------------------------------------------------------------------------- Lookup */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *current;   /* the batch's Current */
    PyObject *pool;      /* batch._pool */
    PyObject *kinds;     /* batch._lookup_kinds: embedding -> its cell's Kind */
    PyObject *fallback;  /* the bound DynamicBatch.lookup */
} Lookup;

static PyObject *
lookup_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Lookup *self = (Lookup *)op;
    PyObject *rec, *kind, *index, *rows, *ops, *attrs, *h, *old;
    Py_ssize_t i, n;
    if (!ready || PyVectorcall_NARGS(nargsf) != 2 ||
        (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0))
        goto fallback;
    index = args[1];
    if (!PyLong_CheckExact(index))
        goto fallback;
    /* (read num_embeddings first: reading it may run Python code, which could change the
     * kinds dict or start a new recording; rec and kind are read after it) */
    rows = PyObject_GetAttr(args[0], str_num_embeddings);
    if (rows == NULL) {
        PyErr_Clear();  /* (the Python method says what is wrong) */
        goto fallback;
    }
    n = PyLong_CheckExact(rows) ? PyLong_AsSsize_t(rows) : -1;
    Py_DECREF(rows);
    i = PyLong_AsSsize_t(index);
    if (n < 0 || i < 0 || i >= n) {
        PyErr_Clear();  /* (an index past Py_ssize_t: out of range, as the method says) */
        goto fallback;
    }
    kind = PyDict_GetItemWithError(self->kinds, args[0]);  /* borrowed; no code runs below */
    rec = current_recording(self->current);
    if (kind == NULL || rec == NULL || !Py_IS_TYPE(kind, KindType) ||
        SLOT(kind, off_k_op_id) == NULL) {
        PyErr_Clear();  /* (an unhashable embedding: the Python method says what it does) */
        goto fallback;
    }
    ops = SLOT(rec, off_r_ops);
    attrs = SLOT(rec, off_r_attrs);
    if (!is_list(ops) || !is_list(attrs) || PyList_GET_SIZE(ops) >= PyList_GET_SIZE(self->pool))
        goto fallback;
    h = PyList_GET_ITEM(self->pool, PyList_GET_SIZE(ops));
    if (!Py_IS_TYPE(h, HandleType))
        goto fallback;
    if (PyList_Append(ops, SLOT(kind, off_k_op_id)) < 0 || PyList_Append(attrs, index) < 0)
        return NULL;
    Py_INCREF(h);
    old = SLOT(h, off_h_rec);
    Py_INCREF(rec);
    SLOT(h, off_h_rec) = rec;
    Py_XDECREF(old);
    old = SLOT(h, off_h_kind);
    Py_INCREF(kind);
    SLOT(h, off_h_kind) = kind;
    Py_XDECREF(old);
    return h;
fallback:
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *
lookup_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"current", "pool", "kinds", "fallback", NULL};
    PyObject *current, *pool, *kinds, *fallback;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!O!O:Lookup", names, &current, &PyList_Type,
                                     &pool, &PyDict_Type, &kinds, &fallback))
        return NULL;
    Lookup *self = (Lookup *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = lookup_vectorcall;
    Py_INCREF(current); self->current = current;
    Py_INCREF(pool); self->pool = pool;
    Py_INCREF(kinds); self->kinds = kinds;
    Py_INCREF(fallback); self->fallback = fallback;
    return (PyObject *)self;
}

static int
lookup_traverse(Lookup *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dict);
    Py_VISIT(self->current);
    Py_VISIT(self->pool);
    Py_VISIT(self->kinds);
    Py_VISIT(self->fallback);
    return 0;
}

static int
lookup_clear(Lookup *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->current);
    Py_CLEAR(self->pool);
    Py_CLEAR(self->kinds);
    Py_CLEAR(self->fallback);
    return 0;
}

static void
lookup_dealloc(Lookup *self)
{
    PyObject_GC_UnTrack(self);
    lookup_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef lookup_members[] = {
    {"fallback", T_OBJECT, offsetof(Lookup, fallback), READONLY,
     "the bound DynamicBatch.lookup this call passes everything but the common case to"},
    {NULL}
};

static PyTypeObject LookupType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "edbatch.api._fastrec.Lookup",
    .tp_doc = "DynamicBatch.lookup with the common case in C (see the module).",
    .tp_basicsize = sizeof(Lookup),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = lookup_new,
    .tp_dealloc = (destructor)lookup_dealloc,
    .tp_traverse = (traverseproc)lookup_traverse,
    .tp_clear = (inquiry)lookup_clear,
    .tp_vectorcall_offset = offsetof(Lookup, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dictoffset = offsetof(Lookup, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = lookup_members,
    .tp_getset = call_getset,
    .tp_repr = call_repr,
};

/* ------------------------------------------------------------------------------ handles */
static PyObject *
fastrec_handles(PyObject *module, PyObject *args)
{
    Py_ssize_t start, stop, i;
    PyObject *out;
    if (!PyArg_ParseTuple(args, "nn:handles", &start, &stop))
        return NULL;
    if (!ready || start < 0 || stop < start) {
        PyErr_SetString(PyExc_ValueError, "handles(start, stop): 0 <= start <= stop, after "
                        "setup()");
        return NULL;
    }
    out = PyList_New(stop - start);
    if (out == NULL)
        return NULL;
    for (i = start; i < stop; i++) {
        PyObject *h = HandleType->tp_alloc(HandleType, 0), *id;
        if (h == NULL || (id = PyLong_FromSsize_t(i)) == NULL) {
            Py_XDECREF(h);
            Py_DECREF(out);
            return NULL;
        }
        SLOT(h, off_h_node) = id;
        PyList_SET_ITEM(out, i - start, h);
    }
    return out;
}

/* Append the exact ints of list `items` to buf as int32 (size 4) or int64 (size 8); 0 when
 * an item is something else or out of range. */
static int
pack_into(PyObject *items, int size, char *buf)
{
    Py_ssize_t i, n = PyList_GET_SIZE(items);
    for (i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        int overflow;
        long long v;
        if (!PyLong_CheckExact(item))
            return 0;
        v = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        if (size == 4) {
            int32_t x = (int32_t)v;
            if (v < INT32_MIN || v > INT32_MAX)
                return 0;
            memcpy(buf + 4 * i, &x, 4);
        } else {
            int64_t x = (int64_t)v;
            memcpy(buf + 8 * i, &x, 8);
        }
    }
    return 1;
}

static PyObject *
fastrec_pack(PyObject *module, PyObject *args)
{
    PyObject *items, *more, *out;
    int size;
    if (!PyArg_ParseTuple(args, "O!iO!:pack", &PyList_Type, &items, &size, &PyList_Type, &more))
        return NULL;
    if (size != 4 && size != 8) {
        PyErr_SetString(PyExc_ValueError, "pack: size 4 (int32) or 8 (int64)");
        return NULL;
    }
    out = PyBytes_FromStringAndSize(NULL, (PyList_GET_SIZE(items) + PyList_GET_SIZE(more)) * size);
    if (out == NULL)
        return NULL;
    if (!pack_into(items, size, PyBytes_AS_STRING(out)) ||
        !pack_into(more, size, PyBytes_AS_STRING(out) + PyList_GET_SIZE(items) * size)) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
}

static PyObject *
fastrec_held(PyObject *module, PyObject *args)
{
    PyObject *pool, *out, *id;
    Py_ssize_t used, free, i;
    if (!PyArg_ParseTuple(args, "O!nn:held", &PyList_Type, &pool, &used, &free))
        return NULL;
    out = PyList_New(0);
    if (out == NULL)
        return NULL;
    if (used > PyList_GET_SIZE(pool))
        used = PyList_GET_SIZE(pool);
    for (i = 0; i < used; i++) {
        if (Py_REFCNT(PyList_GET_ITEM(pool, i)) <= free)
            continue;
        id = PyLong_FromSsize_t(i);
        if (id == NULL || PyList_Append(out, id) < 0) {
            Py_XDECREF(id);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(id);
    }
    return out;
}

/* ------------------------------------------------------------------------------- module */
static PyMethodDef fastrec_methods[] = {
    {"pack", fastrec_pack, METH_VARARGS,
     "pack(items, size, more): the ints of the lists items then more as native int32 (size "
     "4) or int64 (size 8) bytes, as struct.pack packs them; None if one is no exact int "
     "or out of range (then struct decides)."},
    {"held", fastrec_held, METH_VARARGS,
     "held(pool, used, free): the node ids below used whose handle's reference count is "
     "above free (someone besides the pool holds it)."},
    {"handles", fastrec_handles, METH_VARARGS,
     "handles(start, stop): new Handles of node ids start..stop-1 (node_id set, nothing "
     "else), as _handles._fresh makes them one by one."},
    {"setup", fastrec_setup, METH_VARARGS,
     "setup(Handle, Kind, Recording): read the slots' offsets (once, before any call)."},
    {NULL}
};

static struct PyModuleDef fastrec_module = {
    PyModuleDef_HEAD_INIT, "_fastrec",
    "The recorder's per-node hot path in C (edbatch.api._fast uses it).", -1,
    fastrec_methods,
};

PyMODINIT_FUNC
PyInit__fastrec(void)
{
    PyObject *m;
    if (PyType_Ready(&OpCallType) < 0 || PyType_Ready(&AddLossType) < 0 ||
        PyType_Ready(&LookupType) < 0)
        return NULL;
    str_attr = PyUnicode_InternFromString("attr");
    str_num_embeddings = PyUnicode_InternFromString("num_embeddings");
    minus_one = PyLong_FromLong(-1);
    if (str_attr == NULL || str_num_embeddings == NULL || minus_one == NULL)
        return NULL;
    m = PyModule_Create(&fastrec_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&OpCallType);
    Py_INCREF(&AddLossType);
    Py_INCREF(&LookupType);
    if (PyModule_AddObject(m, "OpCall", (PyObject *)&OpCallType) < 0 ||
        PyModule_AddObject(m, "AddLoss", (PyObject *)&AddLossType) < 0 ||
        PyModule_AddObject(m, "Lookup", (PyObject *)&LookupType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
