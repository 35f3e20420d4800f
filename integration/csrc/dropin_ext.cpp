// CPython extension behind integration/sglang_dropins.py: the SGLang fork's DDTree contract,
// built in C++ straight into the Python objects the fork returns.
//
// The tree itself is kernels/csrc/cpu_tree_build.cpp's `build_one` (included below: one
// implementation, bit-exact with kernels.reference and the fork, ties and NaNs included).
// This file only adds what a per-request call costs beyond the tree: the numpy buffers behind
// the five tensors (handed to torch.from_numpy), the parents list and the list of child dicts,
// made with the C API in one call instead of element by element from Python.
//
//   build(lp_addr, ids_addr, H, K, budget) -> the 7-tuple
//       lp: float32 [H, K] and ids: int64 [H, K], C-contiguous, on the CPU (the caller checks);
//       budget <= 0 or H == 0 gives the root-only tree (K >= 1 when H >= 1 and budget >= 1).
//   tree(tok, dep, par, vis, fc, ns, n, vis_stride) -> the 7-tuple copied from the arrays of a
//       tree built elsewhere (the batched CPU / CUDA builders' padded layout).
//   walk(child_maps, post_addr, post_len) -> (accepted, next token), or None where the walk
//       cannot be taken here (child_maps not a plain list of plain dicts, a value that is not an
//       int in range, a path longer than the list): the caller then runs the fork's own walk.
//   set_from_numpy(fn): the torch.from_numpy to wrap the buffers with (once, at load).

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "cpu_tree_build.cpp"

namespace {

PyObject* g_from_numpy = nullptr;  // torch.from_numpy

struct TreeScratch {
  Scratch s;
  std::vector<int64_t> parents;
};

// A new C-contiguous numpy array (1-D of n, or 2-D n x n for bool).
PyArrayObject* new_array(int nd, npy_intp n, int type) {
  npy_intp dims[2] = {n, n};
  return reinterpret_cast<PyArrayObject*>(PyArray_SimpleNew(nd, dims, type));
}

int64_t* i64(PyArrayObject* a) { return static_cast<int64_t*>(PyArray_DATA(a)); }

// parents list, child_maps list of dicts (pop order), and the five tensors -> the 7-tuple.
// `arrays` = tok [n], dep [n], vis [n+1, n+1], fc [n+1], ns [n+1] (steals the references).
PyObject* finish(const int64_t* tok, const int64_t* par, int64_t n, PyArrayObject* arrays[5]) {
  PyObject* out = PyTuple_New(7);
  PyObject* parents = PyList_New(n + 1);
  PyObject* maps = PyList_New(n + 1);
  if (!out || !parents || !maps) goto fail;
  for (int64_t i = 0; i <= n; ++i) {
    PyObject* p = PyLong_FromLongLong(par[i]);
    PyObject* d = PyDict_New();
    PyList_SET_ITEM(parents, i, p);  // a NULL item is released as nothing by the list
    PyList_SET_ITEM(maps, i, d);
    if (!p || !d) goto fail;
  }
  for (int64_t i = 1; i <= n; ++i) {
    PyObject* key = PyLong_FromLongLong(tok[i - 1]);
    PyObject* val = key ? PyLong_FromLongLong(i) : nullptr;
    const int rc = val ? PyDict_SetItem(PyList_GET_ITEM(maps, par[i]), key, val) : -1;
    Py_XDECREF(key);
    Py_XDECREF(val);
    if (rc < 0) goto fail;
  }
  {
    static const int slot[5] = {0, 1, 4, 5, 6};
    for (int j = 0; j < 5; ++j) {
      PyObject* t = PyObject_CallOneArg(g_from_numpy, reinterpret_cast<PyObject*>(arrays[j]));
      Py_CLEAR(arrays[j]);
      if (!t) goto fail;
      PyTuple_SET_ITEM(out, slot[j], t);
    }
  }
  PyTuple_SET_ITEM(out, 2, parents);
  PyTuple_SET_ITEM(out, 3, maps);
  return out;
fail:
  for (int j = 0; j < 5; ++j) Py_CLEAR(arrays[j]);
  Py_XDECREF(parents);
  Py_XDECREF(maps);
  Py_XDECREF(out);
  return nullptr;
}

// Exact-size arrays for a tree of n nodes, copied from padded ones (vis rows of `stride`).
bool exact_arrays(const int64_t* tok, const int64_t* dep, const uint8_t* vis, const int64_t* fc,
                  const int64_t* ns, int64_t n, int64_t stride, PyArrayObject* arrays[5]) {
  const npy_intp s = static_cast<npy_intp>(n) + 1;
  arrays[0] = new_array(1, n, NPY_INT64);
  arrays[1] = new_array(1, n, NPY_INT64);
  arrays[2] = new_array(2, s, NPY_BOOL);
  arrays[3] = new_array(1, s, NPY_INT64);
  arrays[4] = new_array(1, s, NPY_INT64);
  for (int j = 0; j < 5; ++j) {
    if (!arrays[j]) {
      for (int i = 0; i < 5; ++i) Py_CLEAR(arrays[i]);
      return false;
    }
  }
  std::memcpy(i64(arrays[0]), tok, sizeof(int64_t) * n);
  std::memcpy(i64(arrays[1]), dep, sizeof(int64_t) * n);
  uint8_t* v = static_cast<uint8_t*>(PyArray_DATA(arrays[2]));
  for (npy_intp r = 0; r < s; ++r) std::memcpy(v + r * s, vis + r * stride, s);
  std::memcpy(i64(arrays[3]), fc, sizeof(int64_t) * s);
  std::memcpy(i64(arrays[4]), ns, sizeof(int64_t) * s);
  return true;
}

bool as_addr(PyObject* o, void** out) {
  *out = PyLong_AsVoidPtr(o);
  return !(*out == nullptr && PyErr_Occurred());
}

bool as_i64(PyObject* o, int64_t* out) {
  *out = PyLong_AsLongLong(o);
  return !(*out == -1 && PyErr_Occurred());
}

PyObject* py_build(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  void *lp_p, *ids_p;
  int64_t H, K, budget;
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "build(lp_addr, ids_addr, H, K, budget)");
    return nullptr;
  }
  if (!as_addr(args[0], &lp_p) || !as_addr(args[1], &ids_p) || !as_i64(args[2], &H) ||
      !as_i64(args[3], &K) || !as_i64(args[4], &budget))
    return nullptr;
  if (budget <= 0 || H <= 0) budget = H = 0;  // the root-only tree
  if (K < 0 || H > INT32_MAX - 2 || K > INT32_MAX - 2 || budget > (1 << 20) ||
      (budget > 0 && (K == 0 || !lp_p || !ids_p))) {
    PyErr_SetString(PyExc_ValueError, "build: bad shape or budget");
    return nullptr;
  }
  static thread_local TreeScratch ts;
  const int64_t stride = budget + 1;
  try {
    ts.s.heap.resize(static_cast<size_t>(budget) + 2);
    ts.s.paths.resize(static_cast<size_t>(stride) * (H > 0 ? H : 1));
    ts.s.last_child.resize(static_cast<size_t>(stride));
    ts.parents.resize(static_cast<size_t>(stride));
  } catch (const std::bad_alloc&) {
    return PyErr_NoMemory();
  }
  PyArrayObject* full[5] = {new_array(1, budget, NPY_INT64), new_array(1, budget, NPY_INT64),
                            new_array(2, stride, NPY_BOOL), new_array(1, stride, NPY_INT64),
                            new_array(1, stride, NPY_INT64)};
  for (int j = 0; j < 5; ++j) {
    if (!full[j]) {
      for (int i = 0; i < 5; ++i) Py_CLEAR(full[i]);
      return nullptr;
    }
  }
  int64_t *tok = i64(full[0]), *dep = i64(full[1]), *fc = i64(full[3]), *ns = i64(full[4]);
  uint8_t* vis = static_cast<uint8_t*>(PyArray_DATA(full[2]));
  int64_t* par = ts.parents.data();
  for (int64_t i = 0; i < stride; ++i) fc[i] = ns[i] = -1;
  std::memset(vis, 0, static_cast<size_t>(stride * stride));
  const int64_t n = build_one(static_cast<const float*>(lp_p), static_cast<const int64_t*>(ids_p),
                              static_cast<int>(H), static_cast<int>(K), static_cast<int>(budget),
                              ts.s, tok, dep, par, vis, fc, ns);
  if (n == budget) return finish(tok, par, n, full);
  PyArrayObject* exact[5];  // the heap ran dry before the budget: the contract's sizes are n
  const bool ok = exact_arrays(tok, dep, vis, fc, ns, n, stride, exact);
  for (int i = 0; i < 5; ++i) Py_CLEAR(full[i]);
  return ok ? finish(i64(exact[0]), par, n, exact) : nullptr;
}

PyObject* py_tree(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  void* p[6];
  int64_t n, stride;
  if (nargs != 8) {
    PyErr_SetString(PyExc_TypeError, "tree(tok, dep, par, vis, fc, ns, n, vis_stride)");
    return nullptr;
  }
  for (int j = 0; j < 6; ++j)
    if (!as_addr(args[j], &p[j])) return nullptr;
  if (!as_i64(args[6], &n) || !as_i64(args[7], &stride)) return nullptr;
  if (n < 0 || stride < n + 1 || !p[2] || !p[3] || !p[4] || !p[5] || (n > 0 && (!p[0] || !p[1]))) {
    PyErr_SetString(PyExc_ValueError, "tree: bad arrays");
    return nullptr;
  }
  const int64_t* tok = static_cast<const int64_t*>(p[0]);
  PyArrayObject* exact[5];
  if (!exact_arrays(tok, static_cast<const int64_t*>(p[1]), static_cast<const uint8_t*>(p[3]),
                    static_cast<const int64_t*>(p[4]), static_cast<const int64_t*>(p[5]), n,
                    stride, exact))
    return nullptr;
  const int64_t* par = static_cast<const int64_t*>(p[2]);
  for (int64_t i = 1; i <= n; ++i) {
    if (par[i] < 0 || par[i] >= i) {  // parents come before their children, always
      for (int j = 0; j < 5; ++j) Py_CLEAR(exact[j]);
      PyErr_SetString(PyExc_ValueError, "tree: a parent after its child");
      return nullptr;
    }
  }
  return finish(tok, par, n, exact);
}

// The fork's walk: from the root, while the target's token at the node is a key of the node's
// dict, go to that child. Same objects appended (the dicts' own values), same next token.
PyObject* py_walk(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  void* post_p;
  int64_t len;
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "walk(child_maps, post_addr, post_len)");
    return nullptr;
  }
  PyObject* maps = args[0];
  if (!as_addr(args[1], &post_p) || !as_i64(args[2], &len)) return nullptr;
  if (!PyList_CheckExact(maps) || len <= 0 || !post_p) Py_RETURN_NONE;
  const int64_t* post = static_cast<const int64_t*>(post_p);
  const Py_ssize_t count = PyList_GET_SIZE(maps);
  PyObject* path = PyList_New(1);
  if (!path) return nullptr;
  PyObject* zero = PyLong_FromLong(0);
  if (!zero) {
    Py_DECREF(path);
    return nullptr;
  }
  PyList_SET_ITEM(path, 0, zero);
  int64_t node = 0;
  for (Py_ssize_t steps = 0;; ++steps) {
    PyObject* d = node < count ? PyList_GET_ITEM(maps, node) : nullptr;
    if (!d || !PyDict_CheckExact(d) || steps > count) break;  // not ours to walk: the stock's
    PyObject* key = PyLong_FromLongLong(post[node]);
    if (!key) {
      Py_DECREF(path);
      return nullptr;
    }
    PyObject* child = PyDict_GetItemWithError(d, key);  // borrowed
    Py_DECREF(key);
    if (!child) {
      if (PyErr_Occurred()) {  // a key whose comparison raised: let the stock raise it
        PyErr_Clear();
        break;
      }
      PyObject* next = PyLong_FromLongLong(post[node]);
      PyObject* out = next ? PyTuple_Pack(2, path, next) : nullptr;
      Py_XDECREF(next);
      Py_DECREF(path);
      return out;
    }
    if (!PyLong_CheckExact(child)) break;
    int overflow = 0;
    const long long c = PyLong_AsLongLongAndOverflow(child, &overflow);
    if (overflow || c < 0 || c >= len) break;
    if (PyList_Append(path, child) < 0) {
      Py_DECREF(path);
      return nullptr;
    }
    node = c;
  }
  Py_DECREF(path);
  Py_RETURN_NONE;
}

PyObject* py_set_from_numpy(PyObject*, PyObject* fn) {
  Py_INCREF(fn);
  Py_XSETREF(g_from_numpy, fn);
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"build", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_build)),
     METH_FASTCALL, "build(lp_addr, ids_addr, H, K, budget) -> the fork's 7-tuple"},
    {"tree", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_tree)), METH_FASTCALL,
     "tree(tok, dep, par, vis, fc, ns, n, vis_stride) -> the fork's 7-tuple (copies)"},
    {"walk", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_walk)), METH_FASTCALL,
     "walk(child_maps, post_addr, post_len) -> (accepted, next token) or None"},
    {"set_from_numpy", py_set_from_numpy, METH_O, "set_from_numpy(torch.from_numpy)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_ddtree_dropin",
                       "The SGLang fork's DDTree contract in C++ (integration.sglang_dropins).",
                       -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit__ddtree_dropin(void) {
  import_array();
  return PyModule_Create(&kModule);
}
