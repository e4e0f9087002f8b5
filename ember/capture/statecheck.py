"""Capture, module-state snapshots: has a compiled module tree changed since its guards last passed?

A cache entry's *structural* guards (those read through nn.Module attributes: submodules, their
plain attributes, parameters and buffers, hook dicts) are too many to evaluate on every call
(450 for a resnet18). They are evaluated when a snapshot of the module tree they read says the
tree changed, and the snapshot itself is what runs per call. No torch class is patched: ember
must coexist with torch.compile and with libraries in the same process.

A snapshot records, for every module the guards went through, its class and the version tags of
its dicts (`__dict__`, `_parameters`, `_buffers`, `_modules`, the four hook dicts; a hook's
*_with_kwargs / *_always_called companion entries change only with them), and for every tensor
the graph reads off a module, its class, TensorImpl and StorageImpl pointers and `requires_grad`.
CPython bumps a dict's `ma_version_tag` from one process-wide counter on every change of the dict
(3.11 and 3.12; tests/unit/capture/test_module_state.py), so any `setattr`, parameter, buffer or
submodule assignment, hook (un)registration or `.train()`/`.eval()` moves a tag.
`module.to()/.half()/.cuda()` swap a parameter's storage in place (`param.data = ...`), which
moves the StorageImpl pointer; `torch.utils.swap_tensors` moves the TensorImpl; freezing
(`requires_grad_`) flips `requires_grad`.
A module's `__dict__` replaced wholesale is seen too (its identity is checked first). Not seen: a
parameter resized in place. A snapshot holds modules weakly and their dicts not at all, so it
never keeps a deleted model alive (entry.py keeps one state per root, dropped with the root).

The per-call check is a small C extension (built with the C compiler once, 0.2 s, cached on disk
like the kernels): ~1.5 µs for a resnet18. The pointer and flag offsets are found by probing
real tensors when it loads, and checked to follow a storage swap and requires_grad_ both ways. Without a compiler, or if the probe
does not match, the check always answers "changed", so the structural guards run on every call:
correct, only slower (logged once under EMBER_LOGS=perf).

Consumes: modules and tensors (at refresh time). Produces: a callable, `snap() -> bool` (unchanged).
"""
from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import importlib.util
import os
import sysconfig
import weakref

import torch

from ..logging import enabled, get_logger
from .sources import MODULE_TABLES


_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The version tag of a dict: read through the struct, which 3.11 and 3.12 both still update. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
static inline uint64_t tag_of(PyObject *d) { return ((PyDictObject *)d)->ma_version_tag; }

static getter rg_get;          /* TensorBase.requires_grad's C getter (when rg_off < 0) */
static void *rg_closure;
static PyTypeObject *tensor_type;
/* Where a tensor's TensorImpl* sits in its Python object, its Storage and AutogradMeta* in the
   TensorImpl, and the requires_grad flag in the AutogradMeta: found and checked by probing real
   tensors at setup (statecheck._layout); rg_off < 0: the flag is read through the getter. */
static Py_ssize_t impl_off, storage_off, meta_off, rg_off;

typedef struct {
    PyObject_HEAD
    PyObject *objs;            /* tuple: weakrefs to the modules, then the tensors (kept alive) */
    Py_ssize_t n_mod, n_ten;
    uint64_t *vals;            /* per module: type, n dicts, (dict, tag) * n; per tensor: 4 words */
} Snap;

#define TENSOR_WORDS 4
/* type, TensorImpl (swap_tensors moves it), StorageImpl (param.data = ..., what .to()/.half()
   do, moves it), the requires_grad flag (a leaf's; a non-leaf's grad_fn cannot change) */
static int tensor_state(PyObject *t, uint64_t *out) {
    if (!PyObject_TypeCheck(t, tensor_type)) return -1;
    char *impl = *(char **)((char *)t + impl_off);
    out[0] = (uint64_t)(uintptr_t)Py_TYPE(t);
    out[1] = (uint64_t)(uintptr_t)impl;
    out[2] = (uint64_t)(uintptr_t)*(void **)(impl + storage_off);
    if (rg_off >= 0) {
        char *meta = *(char **)(impl + meta_off);
        out[3] = meta == NULL ? 0 : *(uint8_t *)(meta + rg_off);
        return 0;
    }
    PyObject *r = rg_get(t, rg_closure);
    if (r == NULL) { PyErr_Clear(); return -1; }
    out[3] = (uint64_t)(r == Py_True);
    Py_DECREF(r);
    return 0;
}

static void snap_dealloc(Snap *s) {
    Py_XDECREF(s->objs);
    PyMem_Free(s->vals);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* snap() -> True while nothing recorded has changed. A module's dicts are not owned (they would
   keep the module alive through a compiled module's own runner): its __dict__ is checked to be
   the same object first, and while its tag holds, the tables it holds are the recorded ones. */
static PyObject *snap_call(Snap *s, PyObject *args, PyObject *kw) {
    PyObject **o = &PyTuple_GET_ITEM(s->objs, 0);
    uint64_t *v = s->vals;
    Py_ssize_t i;
    for (i = 0; i < s->n_mod; ++i, ++o) {
        PyObject *m = PyWeakref_GET_OBJECT(*o);          /* None once the module is gone */
        if ((uint64_t)(uintptr_t)Py_TYPE(m) != v[0]) Py_RETURN_FALSE;
        PyObject **dp = _PyObject_GetDictPtr(m);
        if (dp == NULL || (uint64_t)(uintptr_t)*dp != v[2]) Py_RETURN_FALSE;
        uint64_t n = v[1];
        v += 2;
        for (uint64_t j = 0; j < n; ++j, v += 2)
            if (tag_of((PyObject *)(uintptr_t)v[0]) != v[1]) Py_RETURN_FALSE;
    }
    for (i = 0; i < s->n_ten; ++i, ++o, v += TENSOR_WORDS) {
        uint64_t now[TENSOR_WORDS];
        if (tensor_state(*o, now) < 0 || memcmp(now, v, sizeof now) != 0) Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

static PyTypeObject SnapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ember_statecheck.Snapshot",
    .tp_basicsize = sizeof(Snap),
    .tp_dealloc = (destructor)snap_dealloc,
    .tp_call = (ternaryfunc)snap_call,
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

/* snapshot(modules: tuple of (weakref to module, tuple of its dicts: __dict__ first),
            tensors: tuple of Tensor) -> Snapshot. Modules are held weakly and their dicts not
   at all: a snapshot never keeps a deleted model alive. */
static PyObject *snapshot(PyObject *self, PyObject *args) {
    PyObject *mods, *tens;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &mods, &PyTuple_Type, &tens))
        return NULL;
    Py_ssize_t nm = PyTuple_GET_SIZE(mods), nt = PyTuple_GET_SIZE(tens), words = 0;
    for (Py_ssize_t i = 0; i < nm; ++i) {
        PyObject *e = PyTuple_GET_ITEM(mods, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2 || !PyWeakref_CheckRef(PyTuple_GET_ITEM(e, 0))
            || !PyTuple_Check(PyTuple_GET_ITEM(e, 1)) || PyTuple_GET_SIZE(PyTuple_GET_ITEM(e, 1)) < 1) {
            PyErr_SetString(PyExc_TypeError, "modules: (weakref, (dict, ...)) pairs");
            return NULL;
        }
        words += 2 + 2 * PyTuple_GET_SIZE(PyTuple_GET_ITEM(e, 1));
    }
    Snap *s = PyObject_New(Snap, &SnapType);
    if (s == NULL) return NULL;
    s->objs = PyTuple_New(nm + nt);
    s->vals = PyMem_Malloc(sizeof(uint64_t) * (words + TENSOR_WORDS * nt + 1));
    s->n_mod = nm; s->n_ten = nt;
    if (s->objs == NULL || s->vals == NULL) { Py_DECREF(s); return PyErr_NoMemory(); }
    uint64_t *v = s->vals;
    for (Py_ssize_t i = 0; i < nm; ++i) {
        PyObject *e = PyTuple_GET_ITEM(mods, i), *r = PyTuple_GET_ITEM(e, 0), *ds = PyTuple_GET_ITEM(e, 1);
        PyObject *m = PyWeakref_GET_OBJECT(r);
        PyObject **dp = _PyObject_GetDictPtr(m);
        if (dp == NULL || *dp != PyTuple_GET_ITEM(ds, 0)) {
            Py_DECREF(s); PyErr_SetString(PyExc_TypeError, "the first dict is not the module's __dict__");
            return NULL;
        }
        Py_INCREF(r);
        PyTuple_SET_ITEM(s->objs, i, r);
        *v++ = (uint64_t)(uintptr_t)Py_TYPE(m);
        *v++ = (uint64_t)PyTuple_GET_SIZE(ds);
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(ds); ++j) {
            PyObject *d = PyTuple_GET_ITEM(ds, j);
            if (!PyDict_Check(d)) { Py_DECREF(s); PyErr_SetString(PyExc_TypeError, "not a dict"); return NULL; }
            *v++ = (uint64_t)(uintptr_t)d;
            *v++ = tag_of(d);
        }
    }
    for (Py_ssize_t i = 0; i < nt; ++i, v += TENSOR_WORDS) {
        PyObject *t = PyTuple_GET_ITEM(tens, i);
        Py_INCREF(t);
        PyTuple_SET_ITEM(s->objs, nm + i, t);
        if (tensor_state(t, v) < 0) {
            Py_DECREF(s);
            PyErr_SetString(PyExc_TypeError, "a tensor whose requires_grad cannot be read");
            return NULL;
        }
    }
    return (PyObject *)s;
}

/* setup(TensorBase, requires_grad getset descriptor, impl_off, storage_off, meta_off, rg_off) */
static PyObject *setup(PyObject *self, PyObject *args) {
    PyObject *cls, *rg;
    if (!PyArg_ParseTuple(args, "O!Onnnn", &PyType_Type, &cls, &rg, &impl_off, &storage_off,
                          &meta_off, &rg_off))
        return NULL;
    if (!PyObject_TypeCheck(rg, &PyGetSetDescr_Type)) {
        PyErr_SetString(PyExc_TypeError, "unexpected descriptor kind");
        return NULL;
    }
    rg_get = ((PyGetSetDescrObject *)rg)->d_getset->get;
    rg_closure = ((PyGetSetDescrObject *)rg)->d_getset->closure;
    Py_INCREF(cls);
    tensor_type = (PyTypeObject *)cls;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"snapshot", snapshot, METH_VARARGS, NULL},
    {"setup", setup, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "ember_statecheck", NULL, -1, methods};

PyMODINIT_FUNC PyInit_ember_statecheck(void) {
    if (PyType_Ready(&SnapType) < 0) return NULL;
    return PyModule_Create(&mod);
}
"""


def never() -> bool:
    """The snapshot of a tree not yet checked: always changed."""
    return False


@functools.lru_cache(None)
def _native():
    """The built extension module, or None (no C compiler / headers: always 'changed')."""
    try:
        from ..runtime.build import build
        # the include dir names the Python version, so the cache key does too (ABI)
        flags = ["-O2", "-shared", "-fPIC", "-std=c11", f"-I{sysconfig.get_paths()['include']}"]
        path = build(_SOURCE, compiler=os.environ.get("CC", "gcc"), flags=flags, suffix="c")
        loader = importlib.machinery.ExtensionFileLoader("ember_statecheck", str(path))
        spec = importlib.util.spec_from_file_location("ember_statecheck", str(path), loader=loader)
        native = importlib.util.module_from_spec(spec)
        loader.exec_module(native)
        tb = torch._C.TensorBase
        native.setup(tb, tb.__dict__["requires_grad"], *_layout())
        return native
    except Exception as e:  # noqa: BLE001 - fall back to checking guards on every call
        if enabled("perf"):
            get_logger("perf").info("module-state snapshots unavailable (%s: %s); structural "
                                    "guards run on every call", type(e).__name__, e)
        return None


def _layout() -> tuple[int, int, int, int]:
    """(offset of the TensorImpl* in a tensor's Python object, of its StorageImpl* and its
    AutogradMeta* in the TensorImpl, of the requires_grad flag in the AutogradMeta), found on
    probe tensors of several kinds and checked to follow a storage swap (`p.data = ...`) and
    requires_grad_ both ways. Raises when the first two fit no offset (then: no snapshots); the
    last two are -1 when they do not fit (then the flag is read through torch's getter)."""
    def word(addr):
        return ctypes.c_void_p.from_address(addr).value or 0

    def byte(addr):
        return ctypes.c_uint8.from_address(addr).value

    def storage(t):
        return t.untyped_storage()._cdata

    # no random constructor here: loading must not move the caller's RNG (a dropout mask after
    # torch.manual_seed would differ from eager's)
    probes = [torch.zeros(3), torch.nn.Parameter(torch.ones(4, 4)),
              torch.zeros(2, dtype=torch.half).requires_grad_(), torch.ones(5)[1:]]
    impl = [o for o in range(8, 64, 8) if all(word(id(t) + o) == t._cdata for t in probes)]
    stor = [o for o in range(8, 128, 8) if all(word(t._cdata + o) == storage(t) for t in probes)]
    if not impl or not stor:
        raise RuntimeError("tensor layout not recognized")
    p = probes[1]
    before = word(p._cdata + stor[0])
    p.data = torch.zeros(2, dtype=torch.float64)
    if word(id(p) + impl[0]) != p._cdata or word(p._cdata + stor[0]) != storage(p) or \
            word(p._cdata + stor[0]) == before:
        raise RuntimeError("tensor layout does not follow a storage swap")
    return impl[0], stor[0], *_requires_grad_layout(word, byte)


def _requires_grad_layout(word, byte) -> tuple[int, int]:
    leaves = [torch.zeros(3), torch.zeros(4, 4, dtype=torch.half), torch.ones(5, dtype=torch.float64)]
    before = [[word(t._cdata + o) for o in range(8, 128, 8)] for t in leaves]
    for t in leaves:
        t.requires_grad_(True)
    after = [[word(t._cdata + o) for o in range(8, 128, 8)] for t in leaves]
    meta = [8 + 8 * i for i in range(len(before[0]))
            if all(b[i] == 0 and a[i] != 0 for b, a in zip(before, after))]
    if len(meta) != 1:
        return -1, -1
    metas = [word(t._cdata + meta[0]) for t in leaves]
    states = []
    for flag in (True, False, True, False):
        for t in leaves:
            t.requires_grad_(flag)
        states.append([[byte(m + k) for k in range(160)] for m in metas])
    if [word(t._cdata + meta[0]) for t in leaves] != metas:
        return -1, -1          # the meta object moved: not a stable place to read
    flag = [k for k in range(160) if all(s[i][k] == (1 - j % 2) for j, s in enumerate(states)
                                         for i in range(len(leaves)))]
    if len(flag) != 1:
        return -1, -1
    p = torch.nn.Parameter(torch.zeros(2))
    m = word(p._cdata + meta[0])
    if not m or byte(m + flag[0]) != 1 or (p.requires_grad_(False), byte(m + flag[0]))[1] != 0:
        return -1, -1
    return meta[0], flag[0]


def snapshot(modules, tensors):
    """A callable answering whether `modules` (their classes and dicts) and `tensors` (their
    storage and requires_grad) are as they are now. Objects that are not modules are skipped."""
    native = _native()
    if native is None:
        return never
    mods = []
    for m in {id(m): m for m in modules if isinstance(m, torch.nn.Module)}.values():
        d = object.__getattribute__(m, "__dict__")
        tables = (t for t in (d.get(n) for n in MODULE_TABLES) if isinstance(t, dict))
        mods.append((weakref.ref(m), (d, *tables)))
    tens = tuple({id(t): t for t in tensors if isinstance(t, torch.Tensor)}.values())
    try:
        return native.snapshot(tuple(mods), tens)
    except TypeError:
        return never          # e.g. a tensor subclass without storage: check every call
