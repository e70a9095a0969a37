// precision_lab._native_kernels: GEMM model kernels on the CPU (CPython C API and the buffer
// protocol; no numpy headers). Python drives them from precision_lab/gemm/native_backend.py,
// which splits the output rows over precision_lab.core.pool.for_chunks; every call releases the
// GIL. The arithmetic is that of precision_lab/cuda/pl_gemm.cuh (shared with the CUDA kernels).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "fpenv.h"

namespace {

struct kernels {
  decltype(&pl_base::k_gemm_rows) gemm_rows;
  decltype(&pl_base::k_align_exps) align_exps;
  decltype(&pl_base::k_fma64_rows) fma64_rows;
  decltype(&pl_base::k_exact_block_rows) exact_block_rows;
  decltype(&pl_base::k_pairwise32_rows) pairwise32_rows;
  decltype(&pl_base::k_fma32_pack) fma32_pack;
  decltype(&pl_base::k_fma32_rows) fma32_rows;
  decltype(&pl_base::k_fma32_tile) fma32_tile;
  decltype(&pl_base::k_bfma_info) bfma_info;
  decltype(&pl_base::k_bfma_pack_b) bfma_pack_b;
  decltype(&pl_base::k_bfma_rows) bfma_rows;
  decltype(&pl_base::k_bfma_grouped_rows) bfma_grouped_rows;
  decltype(&pl_base::k_quantize) quantize;
  decltype(&pl_base::k_dequantize) dequantize;
  decltype(&pl_base::k_blocks) blocks;
  decltype(&pl_base::k_block_amax) block_amax;
  decltype(&pl_base::k_hadamard) hadamard;
  decltype(&pl_base::k_hadamard_exact64) hadamard_exact64;
  decltype(&pl_base::k_hadamard_exact32) hadamard_exact32;
  const char* isa;
};
kernels KT = {pl_base::k_gemm_rows, pl_base::k_align_exps, pl_base::k_fma64_rows, pl_base::k_exact_block_rows, pl_base::k_pairwise32_rows, pl_base::k_fma32_pack, pl_base::k_fma32_rows, pl_base::k_fma32_tile, pl_base::k_bfma_info, pl_base::k_bfma_pack_b, pl_base::k_bfma_rows, pl_base::k_bfma_grouped_rows, pl_base::k_quantize, pl_base::k_dequantize, pl_base::k_blocks, pl_base::k_block_amax, pl_base::k_hadamard, pl_base::k_hadamard_exact64, pl_base::k_hadamard_exact32, "baseline"};

// A C-contiguous buffer of `kind` ('f' float, 'i' integer) and itemsize, or None when allowed.
struct buf {
  Py_buffer v;
  bool held = false;
  void* ptr = nullptr;
  Py_ssize_t n = 0;
  ~buf() {
    if (held) PyBuffer_Release(&v);
  }
};

bool get_buf(PyObject* o, buf* b, char kind, int itemsize, bool writable, const char* name,
             bool allow_none) {
  if (o == Py_None) {
    if (allow_none) return true;
    PyErr_Format(PyExc_TypeError, "%s must be a buffer, got None", name);
    return false;
  }
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(o, &b->v, flags) != 0) return false;
  b->held = true;
  const char* f = b->v.format ? b->v.format : "B";
  if (*f == '<' || *f == '=' || *f == '@') ++f;
  const bool is_float = (*f == 'f' || *f == 'd') && f[1] == 0;
  const bool is_int = strchr("bhilqBHILQ", *f) != nullptr && *f != 0 && f[1] == 0;
  if ((kind == 'f' ? !is_float : !is_int) || b->v.itemsize != itemsize) {
    PyErr_Format(PyExc_TypeError, "%s must be a contiguous %s%d buffer, got format %s, itemsize %zd",
                 name, kind == 'f' ? "float" : "int", itemsize * 8, b->v.format ? b->v.format : "B",
                 b->v.itemsize);
    return false;
  }
  b->ptr = b->v.buf;
  b->n = b->v.len / itemsize;
  return true;
}

// gemm(params, A, B, C, SA, SB, EA, EB, D, r0, r1, flags, B32): output rows r0..r1-1 of the
// model (flags bit 0: every accumulation sum is exact in float64, reference._Model.sum_exact;
// bit 1: no accumulation sum can overflow float64; bit 2: block-FMA sums may run in float32 on
// B32, B as float32).
PyObject* py_gemm(PyObject*, PyObject* args) {
  PyObject *op, *oa, *ob, *oc, *osa, *osb, *oea, *oeb, *od, *ob32 = Py_None;
  long long r0, r1;
  int flags = 0;
  if (!PyArg_ParseTuple(args, "OOOOOOOOOLL|iO", &op, &oa, &ob, &oc, &osa, &osb, &oea, &oeb, &od,
                        &r0, &r1, &flags, &ob32))
    return nullptr;
  buf p, a, b, c, sa, sb, ea, eb, d, b32;
  if (!get_buf(ob32, &b32, 'f', 4, false, "B32", true)) return nullptr;
  if (!get_buf(op, &p, 'i', 8, false, "params", false) || !get_buf(oa, &a, 'f', 8, false, "A", false) ||
      !get_buf(ob, &b, 'f', 8, false, "B", false) || !get_buf(oc, &c, 'f', 8, false, "C", true) ||
      !get_buf(osa, &sa, 'f', 8, false, "SA", true) || !get_buf(osb, &sb, 'f', 8, false, "SB", true) ||
      !get_buf(oea, &ea, 'i', 2, false, "EA", true) || !get_buf(oeb, &eb, 'i', 2, false, "EB", true))
    return nullptr;
  if (PyObject_GetBuffer(od, &d.v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0)
    return nullptr;
  d.held = true;
  const int f32 = d.v.itemsize == 4;
  if (p.n < PL_GEMM_NPARAMS) {
    PyErr_SetString(PyExc_ValueError, "params: expected the int64 entries of pl_gemm.cuh (PL_P_SIZE)");
    return nullptr;
  }
  const long long* q = (const long long*)p.ptr;
  const long long M = q[0], N = q[1], K = q[2], NB = q[3];
  if (r0 < 0 || r1 > NB * M || r0 > r1 || a.n < NB * M * K || b.n < NB * K * N ||
      d.v.len / d.v.itemsize < NB * M * N || (c.ptr && c.n < NB * M * N) ||
      (ea.ptr && ea.n < NB * M * K) || (eb.ptr && eb.n < NB * K * N) ||
      (b32.ptr && b32.n < NB * K * N) || ((flags & 4) && !b32.ptr)) {
    PyErr_SetString(PyExc_ValueError, "gemm: buffer sizes do not match params / row range");
    return nullptr;
  }
  PL_BEGIN_NATIVE KT.gemm_rows(q, (const double*)a.ptr, (const double*)b.ptr,
                                     (const double*)c.ptr, (const double*)sa.ptr,
                                     (const double*)sb.ptr, (const short*)ea.ptr, (const short*)eb.ptr,
                                     (const float*)b32.ptr, d.v.buf, f32, r0, r1, flags);
  PL_END_NATIVE Py_RETURN_NONE;
}

// The rounding of an input as the fp32 FMA kernel packs it (fma32.inc, grid32): None, or 7 int32
// (exponent_bits, mantissa_bits, bias, nan_style, flags, mode, check) with a deterministic mode.
bool get_grid(PyObject* o, buf* g, const char* name) {
  if (!get_buf(o, g, 'i', 4, false, name, true)) return false;
  if (g->ptr == nullptr) return true;
  const int* v = (const int*)g->ptr;
  if (g->n != 7 || v[5] < 0 || v[5] == 6 || v[5] == 8) {  // (6, 8: the stochastic modes)
    PyErr_Format(PyExc_ValueError,
                 "%s must hold 7 int32 (format, deterministic mode, check), got %zd values", name,
                 g->n);
    return false;
  }
  return true;
}

// gemm_fma32(params, A, Bp, C, D, same_out, r0, r1, grid_a=None, seg=0, a_trans=0,
// grid_out=None) -> non-finite count (plus the inputs off the grid with check): fp32 sequential
// nearest-even (fma32.inc) on float32 A (put on its grid as it is packed), packed B (fma32_pack)
// and C (or None). seg > 0: each segment of seg k's summed from +0, then added to the output in
// float32 (fma32_tile_seg); -1 where the kernel does not take that seg (above its K block).
// a_trans: A is given transposed, (NB x K x M) row-major. grid_out (same_out, float32 D, mode
// nearest_even, no check): each output stored rounded onto that grid.
PyObject* py_gemm_fma32(PyObject*, PyObject* args) {
  PyObject *op, *oa, *ob, *oc, *od, *og = Py_None, *ogo = Py_None;
  int same_out;
  long long r0, r1, seg = 0;
  int a_trans = 0;
  if (!PyArg_ParseTuple(args, "OOOOOiLL|OLiO", &op, &oa, &ob, &oc, &od, &same_out, &r0, &r1, &og,
                        &seg, &a_trans, &ogo))
    return nullptr;
  buf p, a, b, c, d, g, go;
  if (!get_buf(op, &p, 'i', 8, false, "params", false) || !get_buf(oa, &a, 'f', 4, false, "A", false) ||
      !get_buf(ob, &b, 'f', 4, false, "Bp", false) || !get_buf(oc, &c, 'f', 4, false, "C", true) ||
      !get_grid(og, &g, "grid_a") || !get_grid(ogo, &go, "grid_out"))
    return nullptr;
  if (go.ptr && (((const int*)go.ptr)[5] != 0 || ((const int*)go.ptr)[6] != 0 || !same_out)) {
    PyErr_SetString(PyExc_ValueError,
                    "gemm_fma32: grid_out needs mode 0 (nearest_even), no check and same_out");
    return nullptr;
  }
  if (PyObject_GetBuffer(od, &d.v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0)
    return nullptr;
  d.held = true;
  if (p.n < PL_GEMM_NPARAMS) {
    PyErr_SetString(PyExc_ValueError, "params: expected the int64 entries of pl_gemm.cuh (PL_P_SIZE)");
    return nullptr;
  }
  const long long* q = (const long long*)p.ptr;
  const long long M = q[0], N = q[1], K = q[2], NB = q[3];
  const long long nr = KT.fma32_tile(1), npan = (N + nr - 1) / nr;
  if (r0 < 0 || r1 > NB * M || r0 > r1 || a.n < NB * M * K || b.n < NB * npan * K * nr ||
      d.v.len / d.v.itemsize < NB * M * N || (c.ptr && c.n < NB * M * N) ||
      !(d.v.itemsize == 4 || d.v.itemsize == 8) || (go.ptr && d.v.itemsize != 4)) {
    PyErr_SetString(PyExc_ValueError, "gemm_fma32: buffer sizes do not match params / row range");
    return nullptr;
  }
  const int f32 = d.v.itemsize == 4;
  long long bad;
  PL_BEGIN_NATIVE bad = KT.fma32_rows(q, (const float*)a.ptr, (const float*)b.ptr,
                                             (const float*)c.ptr, d.v.buf, f32, same_out, r0, r1,
                                             (const int*)g.ptr, seg, a_trans,
                                             (const int*)go.ptr);
  PL_END_NATIVE return PyLong_FromLongLong(bad);
}

// fma32_pack(B, Bp, K, N, q0, q1, grid=None, b_trans=0) -> inputs off the grid (with check):
// panels q0..q1-1 of B (nb x K x N float32, or with b_trans its transpose nb x N x K, put on its
// grid as it is packed) into Bp, which holds nb * ceil(N / NR) panels of K x NR floats (NR:
// fma32_tile()[1]).
PyObject* py_fma32_pack(PyObject*, PyObject* args) {
  PyObject *ob, *op, *og = Py_None;
  long long K, N, q0, q1;
  int b_trans = 0;
  if (!PyArg_ParseTuple(args, "OOLLLL|Oi", &ob, &op, &K, &N, &q0, &q1, &og, &b_trans))
    return nullptr;
  buf b, bp, g;
  if (!get_buf(ob, &b, 'f', 4, false, "B", false) || !get_buf(op, &bp, 'f', 4, true, "Bp", false) ||
      !get_grid(og, &g, "grid"))
    return nullptr;
  const long long nr = KT.fma32_tile(1), npan = (N + nr - 1) / nr;
  const long long nb = npan > 0 && K > 0 ? bp.n / (npan * K * nr) : 0;
  if (K < 0 || N < 0 || q0 < 0 || q0 > q1 || (q1 > q0 && (q1 > nb * npan || b.n < nb * K * N))) {
    PyErr_SetString(PyExc_ValueError, "fma32_pack: buffer sizes do not match K, N / panel range");
    return nullptr;
  }
  long long miss;
  PL_BEGIN_NATIVE miss = KT.fma32_pack((const float*)b.ptr, (float*)bp.ptr, K, N, q0, q1,
                                       (const int*)g.ptr, b_trans);
  PL_END_NATIVE return PyLong_FromLongLong(miss);
}

// fma32_tile() -> (MR, NR): rows and columns of the fp32 FMA kernel's register tile.
PyObject* py_fma32_tile(PyObject*, PyObject*) {
  return Py_BuildValue("ii", KT.fma32_tile(0), KT.fma32_tile(1));
}

// align_exponents(x, emin, out): max(floor(log2|x|), emin) as int16 (zero: -16384).
PyObject* py_align_exponents(PyObject*, PyObject* args) {
  PyObject *ox, *oo;
  int emin;
  if (!PyArg_ParseTuple(args, "OiO", &ox, &emin, &oo)) return nullptr;
  buf x, o;
  if (!get_buf(ox, &x, 'f', 8, false, "x", false)) return nullptr;
  if (!get_buf(oo, &o, 'i', 2, true, "out", false)) return nullptr;
  if (o.n < x.n) {
    PyErr_SetString(PyExc_ValueError, "align_exponents: out is shorter than x");
    return nullptr;
  }
  PL_BEGIN_NATIVE KT.align_exps((const double*)x.ptr, (short*)o.ptr, x.n, emin);
  PL_END_NATIVE Py_RETURN_NONE;
}

// quantize(x, out, out_code, C, inner, S, Z, mode, short, torch, qmin, qmax, lo, hi) -> NaN count
PyObject* py_quantize(PyObject*, PyObject* args) {
  PyObject *ox, *oo, *os, *oz;
  int code, mode, shortp, torch;
  long long C, inner, lo, hi;
  double qmin, qmax;
  if (!PyArg_ParseTuple(args, "OOiLLOOiiiddLL", &ox, &oo, &code, &C, &inner, &os, &oz, &mode,
                        &shortp, &torch, &qmin, &qmax, &lo, &hi))
    return nullptr;
  buf x, o, sc, zp;
  if (PyObject_GetBuffer(ox, &x.v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return nullptr;
  x.held = true;
  if (!(x.v.itemsize == 4 || x.v.itemsize == 8)) {
    PyErr_SetString(PyExc_TypeError, "x must be a float32 or float64 buffer");
    return nullptr;
  }
  static const int sizes[6] = {1, 1, 2, 2, 4, 4};
  if (code < 0 || code > 5) {
    PyErr_SetString(PyExc_ValueError, "out_code must be in 0..5");
    return nullptr;
  }
  if (PyObject_GetBuffer(oo, &o.v, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) return nullptr;
  o.held = true;
  if (!get_buf(os, &sc, 'f', 8, false, "S", false) || !get_buf(oz, &zp, 'f', 8, false, "Z", false))
    return nullptr;
  const long long n = x.v.len / x.v.itemsize;
  if (o.v.len < n * sizes[code] || lo < 0 || hi > n || lo > hi || C < 1 || inner < 1 ||
      sc.n < C || zp.n < C) {
    PyErr_SetString(PyExc_ValueError, "quantize: buffer sizes do not match");
    return nullptr;
  }
  long long nan;
  PL_BEGIN_NATIVE nan =
      KT.quantize(x.v.buf, x.v.itemsize == 8, o.v.buf, code, C, inner, (const double*)sc.ptr,
                  (const double*)zp.ptr, mode, shortp, torch, qmin, qmax, lo, hi);
  PL_END_NATIVE return PyLong_FromLongLong(nan);
}

// dequantize(q, q_code, out, short, C, inner, S, Z, lo, hi): out float32 or float64
PyObject* py_dequantize(PyObject*, PyObject* args) {
  PyObject *oq, *oo, *os, *oz;
  int code, shortp;
  long long C, inner, lo, hi;
  if (!PyArg_ParseTuple(args, "OiOiLLOOLL", &oq, &code, &oo, &shortp, &C, &inner, &os, &oz, &lo,
                        &hi))
    return nullptr;
  buf q, o, sc, zp;
  static const int sizes[6] = {1, 1, 2, 2, 4, 4};
  if (code < 0 || code > 5) {
    PyErr_SetString(PyExc_ValueError, "q_code must be in 0..5");
    return nullptr;
  }
  if (PyObject_GetBuffer(oq, &q.v, PyBUF_C_CONTIGUOUS) != 0) return nullptr;
  q.held = true;
  if (PyObject_GetBuffer(oo, &o.v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0)
    return nullptr;
  o.held = true;
  if (!get_buf(os, &sc, 'f', 8, false, "S", false) || !get_buf(oz, &zp, 'f', 8, false, "Z", false))
    return nullptr;
  const long long n = q.v.len / sizes[code];
  if (!(o.v.itemsize == 4 || o.v.itemsize == 8) || o.v.len / o.v.itemsize < n || lo < 0 ||
      hi > n || lo > hi || C < 1 || inner < 1 || sc.n < C || zp.n < C) {
    PyErr_SetString(PyExc_ValueError, "dequantize: buffer sizes do not match");
    return nullptr;
  }
  PL_BEGIN_NATIVE KT.dequantize(q.v.buf, code, o.v.buf, o.v.itemsize == 8, shortp, C, inner,
                                       (const double*)sc.ptr, (const double*)zp.ptr, lo, hi);
  PL_END_NATIVE Py_RETURN_NONE;
}

// blocks(x, out, dims(4 int64), rule, mode, codes_only, int_elem, int_bits, elem(5 int32),
//        scale(5 int32), ints(5 int32), dbls(5 float64), values, key, u0, u1)
// key: None, or (seed_lo, seed_hi, random_bits) uint64 for stochastic rounding
PyObject* py_blocks(PyObject*, PyObject* args) {
  PyObject *ox, *oo, *odims, *oel, *osc, *oints, *odbl, *oval, *okey;
  int rule, mode, codes_only, int_elem, int_bits;
  long long u0, u1;
  if (!PyArg_ParseTuple(args, "OOOiiiiiOOOOOOLL", &ox, &oo, &odims, &rule, &mode, &codes_only,
                        &int_elem, &int_bits, &oel, &osc, &oints, &odbl, &oval, &okey, &u0, &u1))
    return nullptr;
  buf x, o, dims, el, sc, ints, dbl, val, key;
  if (PyObject_GetBuffer(ox, &x.v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return nullptr;
  x.held = true;
  if (PyObject_GetBuffer(oo, &o.v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0)
    return nullptr;
  o.held = true;
  if (!get_buf(odims, &dims, 'i', 8, false, "dims", false) ||
      !get_buf(oel, &el, 'i', 4, false, "elem", false) ||
      !get_buf(osc, &sc, 'i', 4, false, "scale", false) ||
      !get_buf(oints, &ints, 'i', 4, false, "ints", false) ||
      !get_buf(odbl, &dbl, 'f', 8, false, "dbls", false) ||
      !get_buf(oval, &val, 'f', 8, true, "values", false) ||
      !get_buf(okey, &key, 'i', 8, false, "key", true))
    return nullptr;
  const long long* dm = (const long long*)dims.ptr;
  const long long U = dm[0], A = dm[1], B = dm[2], C = dm[3];
  const int isz = (int)x.v.itemsize;
  if (!(isz == 4 || isz == 8) || o.v.itemsize != isz || dims.n < 4 || el.n < 5 || sc.n < 5 ||
      ints.n < 5 || dbl.n < 5 || x.v.len / isz < U * A * B * C || o.v.len / isz < U * A * B * C ||
      val.n < U * B || (key.ptr && key.n < 3) || u0 < 0 || u1 > U || u0 > u1) {
    PyErr_SetString(PyExc_ValueError, "blocks: buffer sizes do not match");
    return nullptr;
  }
  PL_BEGIN_NATIVE KT.blocks(x.v.buf, o.v.buf, isz == 8, U, A, B, C, rule, mode, codes_only,
                                   int_elem, int_bits, (const int*)el.ptr, (const int*)sc.ptr,
                                   (const int*)ints.ptr, (const double*)dbl.ptr,
                                   (double*)val.ptr, (const unsigned long long*)key.ptr, u0, u1);
  PL_END_NATIVE Py_RETURN_NONE;
}

// block_amax(x, dims(4 int64), out(float64 U*B, or None), u0, u1) -> the largest block amax
// that is a finite FP32 value (0.0 if none)
PyObject* py_block_amax(PyObject*, PyObject* args) {
  PyObject *ox, *odims, *oo;
  long long u0, u1;
  if (!PyArg_ParseTuple(args, "OOOLL", &ox, &odims, &oo, &u0, &u1)) return nullptr;
  buf x, dims, o;
  if (PyObject_GetBuffer(ox, &x.v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return nullptr;
  x.held = true;
  if (!get_buf(odims, &dims, 'i', 8, false, "dims", false) ||
      !get_buf(oo, &o, 'f', 8, true, "out", true))
    return nullptr;
  const long long* dm = (const long long*)dims.ptr;
  const long long U = dm[0], A = dm[1], B = dm[2], C = dm[3];
  const int isz = (int)x.v.itemsize;
  if (!(isz == 4 || isz == 8) || x.v.len / isz < U * A * B * C || (o.ptr && o.n < U * B) || u0 < 0 ||
      u1 > U || u0 > u1) {
    PyErr_SetString(PyExc_ValueError, "block_amax: buffer sizes do not match");
    return nullptr;
  }
  double big;
  PL_BEGIN_NATIVE big = KT.block_amax(x.v.buf, isz == 8, A, B, C, (double*)o.ptr, u0, u1);
  PL_END_NATIVE return PyFloat_FromDouble(big);
}

// hadamard(x, out, n, signs, inverse, c, b0, b1): blocks b0..b1-1 of n float32 values of x
// transformed into out (hadamard.inc); signs: n float32 values +-1, or None
PyObject* py_hadamard(PyObject*, PyObject* args) {
  PyObject *ox, *oo, *os;
  long long n, b0, b1;
  int inverse;
  double c;
  if (!PyArg_ParseTuple(args, "OOLOidLL", &ox, &oo, &n, &os, &inverse, &c, &b0, &b1))
    return nullptr;
  buf x, o, s;
  if (!get_buf(ox, &x, 'f', 4, false, "x", false) || !get_buf(oo, &o, 'f', 4, true, "out", false) ||
      !get_buf(os, &s, 'f', 4, false, "signs", true))
    return nullptr;
  if (n < 1 || n > 4096 || (n & (n - 1)) || b0 < 0 || b0 > b1 || x.n < b1 * n || o.n < b1 * n ||
      (s.ptr && s.n < n)) {
    PyErr_SetString(PyExc_ValueError, "hadamard: buffer sizes do not match");
    return nullptr;
  }
  PL_BEGIN_NATIVE KT.hadamard((const float*)x.ptr, (float*)o.ptr, n, (const float*)s.ptr, inverse,
                              (float)c, b0, b1);
  PL_END_NATIVE Py_RETURN_NONE;
}

// hadamard_exact64(x, out, flags, n, signs, b0, b1): blocks b0..b1-1 of n float32 values of x:
// out (float64) = the float64 butterflies of signs * x, flags (uint8) = 1 where those are the
// exact transform of finite values (hadamard.inc); signs: n float64 values +-1, or None
PyObject* py_hadamard_exact64(PyObject*, PyObject* args) {
  PyObject *ox, *oo, *of, *os;
  long long n, b0, b1;
  if (!PyArg_ParseTuple(args, "OOOLOLL", &ox, &oo, &of, &n, &os, &b0, &b1)) return nullptr;
  buf x, o, f, s;
  if (!get_buf(ox, &x, 'f', 4, false, "x", false) || !get_buf(oo, &o, 'f', 8, true, "out", false) ||
      !get_buf(of, &f, 'i', 1, true, "flags", false) ||
      !get_buf(os, &s, 'f', 8, false, "signs", true))
    return nullptr;
  if (n < 1 || n > 4096 || (n & (n - 1)) || b0 < 0 || b0 > b1 || x.n < b1 * n || o.n < b1 * n ||
      f.n < b1 || (s.ptr && s.n < n)) {
    PyErr_SetString(PyExc_ValueError, "hadamard_exact64: buffer sizes do not match");
    return nullptr;
  }
  PL_BEGIN_NATIVE KT.hadamard_exact64((const float*)x.ptr, (double*)o.ptr, (unsigned char*)f.ptr,
                                      n, (const double*)s.ptr, b0, b1);
  PL_END_NATIVE Py_RETURN_NONE;
}

// hadamard_exact32(x, out, flags, n, C, signs, inverse, odd, c1, c2, b0, b1): blocks b0..b1-1 of
// x laid out (R, n, C) (block r * C + c: n values C apart), the exact transform rounded to
// float64 then float32 into out (float32, the same layout), flags as hadamard_exact64
// (hadamard.inc's k_hadamard_exact32); signs: n float64 values +-1, or None
PyObject* py_hadamard_exact32(PyObject*, PyObject* args) {
  PyObject *ox, *oo, *of, *os;
  long long n, C, b0, b1;
  int inverse, odd;
  double c1, c2;
  if (!PyArg_ParseTuple(args, "OOOLLOiiddLL", &ox, &oo, &of, &n, &C, &os, &inverse, &odd, &c1, &c2,
                        &b0, &b1))
    return nullptr;
  buf x, o, f, s;
  if (!get_buf(ox, &x, 'f', 4, false, "x", false) || !get_buf(oo, &o, 'f', 4, true, "out", false) ||
      !get_buf(of, &f, 'i', 1, true, "flags", false) ||
      !get_buf(os, &s, 'f', 8, false, "signs", true))
    return nullptr;
  if (n < 1 || n > 4096 || (n & (n - 1)) || C < 1 || b0 < 0 || b0 > b1 || x.n < b1 * n ||
      x.n % (n * C) || o.n != x.n || f.n < b1 || b1 > x.n / n || (s.ptr && s.n < n)) {
    PyErr_SetString(PyExc_ValueError, "hadamard_exact32: buffer sizes do not match");
    return nullptr;
  }
  PL_BEGIN_NATIVE KT.hadamard_exact32((const float*)x.ptr, (float*)o.ptr, (unsigned char*)f.ptr, n,
                                      C, (const double*)s.ptr, inverse, odd, c1, c2, b0, b1);
  PL_END_NATIVE Py_RETURN_NONE;
}

// The int32 options of the block-FMA fast path (blockfma_fast.inc, BF_O_SIZE entries).
bool get_bfma_opts(PyObject* o, buf* b) {
  if (!get_buf(o, b, 'i', 4, false, "opts", false)) return false;
  if (b->n < 11) {
    PyErr_Format(PyExc_ValueError, "opts must hold 11 int32, got %zd values", b->n);
    return false;
  }
  return true;
}

bool get_params(PyObject* o, buf* b) {
  if (!get_buf(o, b, 'i', 8, false, "params", false)) return false;
  if (b->n < PL_GEMM_NPARAMS) {
    PyErr_SetString(PyExc_ValueError, "params: expected the int64 entries of pl_gemm.cuh (PL_P_SIZE)");
    return false;
  }
  return true;
}

// bfma_info(params, opts) -> (MR, NR, entries): the register tile of the block-FMA fast path and
// the int32 entries of OB per column of a panel (the block FMAs along K x the planes of each).
PyObject* py_bfma_info(PyObject*, PyObject* args) {
  PyObject *op, *oo;
  if (!PyArg_ParseTuple(args, "OO", &op, &oo)) return nullptr;
  buf p, o;
  if (!get_params(op, &p) || !get_bfma_opts(oo, &o)) return nullptr;
  long long out[3];
  KT.bfma_info((const long long*)p.ptr, (const int*)o.ptr, out);
  return Py_BuildValue("LLL", out[0], out[1], out[2]);
}

// The scale blocks along K of a block-FMA call (opts[7]: the scale block, 0 for none).
long long bfma_scale_blocks(const buf& o, long long K) {
  const long long kb = ((const int*)o.ptr)[7];
  return kb > 0 ? (K + kb - 1) / kb : 1;
}

// bfma_pack_b(params, opts, B, Bs, Be, OB, q0, q1, grid=None, sexp=None) -> (bad, spread):
// panels q0..q1-1 of B (nb x K x N float32, put on its grid as it is packed) into Bs (float32),
// Be (int32): nb * ceil(N / NR) panels of K x NR, and OB (int32): panels of units x NR; bad:
// inputs off the grid (with check) or not finite. sexp: the exponents of B's power-of-two block
// scales (int32, nb x scale blocks x N; block-scaled MMA).
PyObject* py_bfma_pack_b(PyObject*, PyObject* args) {
  PyObject *op, *oo, *ob, *obs, *obe, *oob, *og = Py_None, *osx = Py_None;
  long long q0, q1;
  if (!PyArg_ParseTuple(args, "OOOOOOLL|OO", &op, &oo, &ob, &obs, &obe, &oob, &q0, &q1, &og, &osx))
    return nullptr;
  buf p, o, b, bs, be, obb, g, sx;
  if (!get_params(op, &p) || !get_bfma_opts(oo, &o) || !get_buf(ob, &b, 'f', 4, false, "B", false) ||
      !get_buf(obs, &bs, 'f', 4, true, "Bs", false) || !get_buf(obe, &be, 'i', 4, true, "Be", false) ||
      !get_buf(oob, &obb, 'i', 4, true, "OB", false) || !get_grid(og, &g, "grid") ||
      !get_buf(osx, &sx, 'i', 4, false, "sexp", true))
    return nullptr;
  const long long* q = (const long long*)p.ptr;
  const long long N = q[1], K = q[2], NB = q[3];
  long long info[3];
  KT.bfma_info(q, (const int*)o.ptr, info);
  const long long npan = (N + info[1] - 1) / info[1];
  if (q0 < 0 || q0 > q1 || q1 > NB * npan || b.n < NB * K * N || bs.n < NB * npan * K * info[1] ||
      be.n < NB * npan * K * info[1] || obb.n < NB * npan * info[2] * info[1] ||
      (sx.ptr && sx.n < NB * bfma_scale_blocks(o, K) * N)) {
    PyErr_SetString(PyExc_ValueError, "bfma_pack_b: buffer sizes do not match params / panel range");
    return nullptr;
  }
  long long bad;
  int spread = 0;
  PL_BEGIN_NATIVE bad = KT.bfma_pack_b(q, (const int*)o.ptr, (const float*)b.ptr, (float*)bs.ptr,
                                       (int*)be.ptr, (int*)obb.ptr, q0, q1, (const int*)g.ptr,
                                       &spread, (const int*)sx.ptr);
  PL_END_NATIVE return Py_BuildValue("Li", bad, spread);
}

// bfma_rows(params, opts, A, Bs, Be, OB, C, D, r0, r1, grid_a, spread_b, sexp=None) -> bad:
// output rows r0..r1-1 of the block-FMA model on float32 A (put on its grid as it is packed),
// the packed B (bfma_pack_b) and C (float32 or None); bad (inputs of A off the grid or not
// finite, units whose spread is too wide) non-zero: D is not the model's. sexp: the exponents
// of A's power-of-two block scales (int32, nb x M x scale blocks; block-scaled MMA).
PyObject* py_bfma_rows(PyObject*, PyObject* args) {
  PyObject *op, *oo, *oa, *obs, *obe, *oob, *oc, *od, *og, *osx = Py_None;
  long long r0, r1;
  int spread_b;
  if (!PyArg_ParseTuple(args, "OOOOOOOOLLOi|O", &op, &oo, &oa, &obs, &obe, &oob, &oc, &od, &r0,
                        &r1, &og, &spread_b, &osx))
    return nullptr;
  buf p, o, a, bs, be, obb, c, d, g, sx;
  if (!get_params(op, &p) || !get_bfma_opts(oo, &o) || !get_buf(oa, &a, 'f', 4, false, "A", false) ||
      !get_buf(obs, &bs, 'f', 4, false, "Bs", false) || !get_buf(obe, &be, 'i', 4, false, "Be", false) ||
      !get_buf(oob, &obb, 'i', 4, false, "OB", false) || !get_buf(oc, &c, 'f', 4, false, "C", true) ||
      !get_grid(og, &g, "grid_a") || !get_buf(osx, &sx, 'i', 4, false, "sexp", true))
    return nullptr;
  if (PyObject_GetBuffer(od, &d.v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0)
    return nullptr;
  d.held = true;
  const long long* q = (const long long*)p.ptr;
  const long long M = q[0], N = q[1], K = q[2], NB = q[3];
  long long info[3];
  KT.bfma_info(q, (const int*)o.ptr, info);
  const long long npan = (N + info[1] - 1) / info[1];
  if (r0 < 0 || r1 > NB * M || r0 > r1 || a.n < NB * M * K || bs.n < NB * npan * K * info[1] ||
      be.n < NB * npan * K * info[1] || obb.n < NB * npan * info[2] * info[1] ||
      d.v.len / d.v.itemsize < NB * M * N || (c.ptr && c.n < NB * M * N) ||
      (sx.ptr && sx.n < NB * M * bfma_scale_blocks(o, K)) ||
      !(d.v.itemsize == 4 || d.v.itemsize == 8)) {
    PyErr_SetString(PyExc_ValueError, "bfma_rows: buffer sizes do not match params / row range");
    return nullptr;
  }
  const int f32 = d.v.itemsize == 4;
  long long bad;
  PL_BEGIN_NATIVE bad = KT.bfma_rows(q, (const int*)o.ptr, (const float*)a.ptr, (const float*)bs.ptr,
                                     (const int*)be.ptr, (const int*)obb.ptr, (const float*)c.ptr,
                                     d.v.buf, f32, r0, r1, (const int*)g.ptr, spread_b,
                                     (const int*)sx.ptr);
  PL_END_NATIVE return PyLong_FromLongLong(bad);
}

// The buffers of a row kernel (fma64_rows, exact_block_rows, pairwise32_rows): A ((nb x M) x K),
// B (nb x K x N), C ((nb x M) x N, or None) of itemsize isz, D ((nb x M) x N) of itemsize dsz, nb
// from D's size; false (a Python error set, naming `name`) when they or the row range r0..r1 do
// not match M, N, K.
bool get_row_bufs(const char* name, PyObject* oa, PyObject* ob, PyObject* oc, PyObject* od, int isz,
                  int dsz, long long M, long long N, long long K, long long r0, long long r1, buf* a,
                  buf* b, buf* c, buf* d) {
  if (!get_buf(oa, a, 'f', isz, false, "A", false) || !get_buf(ob, b, 'f', isz, false, "B", false) ||
      !get_buf(oc, c, 'f', isz, false, "C", true) || !get_buf(od, d, 'f', dsz, true, "D", false))
    return false;
  const long long rows = M > 0 ? d->n / (N > 0 ? N : 1) : 0, nb = M > 0 ? rows / M : 0;
  if (M < 0 || N < 0 || K < 0 || r0 < 0 || r0 > r1 || r1 > nb * M || d->n < nb * M * N ||
      a->n < nb * M * K || b->n < nb * K * N || (c->ptr && c->n < nb * M * N)) {
    PyErr_Format(PyExc_ValueError, "%s: buffer sizes do not match M, N, K / row range", name);
    return false;
  }
  return true;
}

// fma64_rows(A, B, C, D, M, N, K, r0, r1): output rows r0..r1-1 of the fp64 FMA chain d = c +
// sum a_k * b_k (one fma per k, in k order) on float64 A ((nb x M) x K), B (nb x K x N), C
// ((nb x M) x N, or None: +0) into D ((nb x M) x N).
PyObject* py_fma64_rows(PyObject*, PyObject* args) {
  PyObject *oa, *ob, *oc, *od;
  long long M, N, K, r0, r1;
  if (!PyArg_ParseTuple(args, "OOOOLLLLL", &oa, &ob, &oc, &od, &M, &N, &K, &r0, &r1)) return nullptr;
  buf a, b, c, d;
  if (!get_row_bufs("fma64_rows", oa, ob, oc, od, 8, 8, M, N, K, r0, r1, &a, &b, &c, &d))
    return nullptr;
  PL_BEGIN_NATIVE KT.fma64_rows((const double*)a.ptr, (const double*)b.ptr, (const double*)c.ptr,
                                (double*)d.ptr, M, N, K, r0, r1);
  PL_END_NATIVE Py_RETURN_NONE;
}

// exact_block_rows(A, B, C, D, M, N, K, block, r0, r1): output rows r0..r1-1 of the exact block
// sums rounded once to float32 on float64 A ((nb x M) x K), B (nb x K x N), C ((nb x M) x N, or
// None: +0) into float32 D ((nb x M) x N).
PyObject* py_exact_block_rows(PyObject*, PyObject* args) {
  PyObject *oa, *ob, *oc, *od;
  long long M, N, K, blk, r0, r1;
  if (!PyArg_ParseTuple(args, "OOOOLLLLLL", &oa, &ob, &oc, &od, &M, &N, &K, &blk, &r0, &r1))
    return nullptr;
  buf a, b, c, d;
  if (!get_row_bufs("exact_block_rows", oa, ob, oc, od, 8, 4, M, N, K, r0, r1, &a, &b, &c, &d))
    return nullptr;
  if (blk < 1 || blk > 1024) {
    PyErr_Format(PyExc_ValueError, "exact_block_rows: block must be in 1..1024, got %lld", blk);
    return nullptr;
  }
  PL_BEGIN_NATIVE KT.exact_block_rows((const double*)a.ptr, (const double*)b.ptr,
                                      (const double*)c.ptr, (float*)d.ptr, M, N, K, blk, r0, r1);
  PL_END_NATIVE Py_RETURN_NONE;
}

// pairwise32_rows(A, B, C, D, M, N, K, P, flush, r0, r1): output rows r0..r1-1 of the float32
// pairwise sums of segments of P products promoted into float32 (subnormal results flushed with
// flush) on float32 A ((nb x M) x K), B (nb x K x N), C ((nb x M) x N, or None: +0) into D.
PyObject* py_pairwise32_rows(PyObject*, PyObject* args) {
  PyObject *oa, *ob, *oc, *od;
  long long M, N, K, P, r0, r1;
  int flush;
  if (!PyArg_ParseTuple(args, "OOOOLLLLiLL", &oa, &ob, &oc, &od, &M, &N, &K, &P, &flush, &r0, &r1))
    return nullptr;
  buf a, b, c, d;
  if (!get_row_bufs("pairwise32_rows", oa, ob, oc, od, 4, 4, M, N, K, r0, r1, &a, &b, &c, &d))
    return nullptr;
  if (P < 1 || P > 64) {
    PyErr_Format(PyExc_ValueError, "pairwise32_rows: P must be in 1..64, got %lld", P);
    return nullptr;
  }
  PL_BEGIN_NATIVE KT.pairwise32_rows((const float*)a.ptr, (const float*)b.ptr, (const float*)c.ptr,
                                     (float*)d.ptr, M, N, K, P, flush, r0, r1);
  PL_END_NATIVE Py_RETURN_NONE;
}

// bfma_grouped_rows(params, opts, A, B, SA, SB, ESA, ESB, C, D, G, kblock, r0, r1, grid=None)
// -> bad: output rows r0..r1-1 of block-scaled MMA with groups of G products (float64 A ((nb x
// M) x K) and B (nb x K x N), scales SA ((nb x M) x nkb) and SB (nb x nkb x N) with their int32
// exponents, float32 C or None) into D (float32 or float64), nkb = ceil(K / kblock). grid (6
// float64: mantissa bits, emin, max of A's format, then B's): the inputs are checked to lie on
// it (rows r0..r1-1 of A; all of B where r0 = 0); bad: those that do not or are not finite
// (D then not computed).
PyObject* py_bfma_grouped_rows(PyObject*, PyObject* args) {
  PyObject *op, *oo, *oa, *ob, *osa, *osb, *oea, *oeb, *oc, *od, *og = Py_None;
  long long G, kblock, r0, r1;
  if (!PyArg_ParseTuple(args, "OOOOOOOOOOLLLL|O", &op, &oo, &oa, &ob, &osa, &osb, &oea, &oeb, &oc,
                        &od, &G, &kblock, &r0, &r1, &og))
    return nullptr;
  buf p, o, a, b, sa, sb, ea, eb, c, d, g;
  if (!get_buf(og, &g, 'f', 8, false, "grid", true)) return nullptr;
  if (g.ptr && g.n < 6) {
    PyErr_SetString(PyExc_ValueError, "grid must hold 6 float64");
    return nullptr;
  }
  if (!get_params(op, &p) || !get_bfma_opts(oo, &o) || !get_buf(oa, &a, 'f', 8, false, "A", false) ||
      !get_buf(ob, &b, 'f', 8, false, "B", false) || !get_buf(osa, &sa, 'f', 8, false, "SA", false) ||
      !get_buf(osb, &sb, 'f', 8, false, "SB", false) || !get_buf(oea, &ea, 'i', 4, false, "ESA", false) ||
      !get_buf(oeb, &eb, 'i', 4, false, "ESB", false) || !get_buf(oc, &c, 'f', 4, false, "C", true))
    return nullptr;
  if (PyObject_GetBuffer(od, &d.v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0)
    return nullptr;
  d.held = true;
  const long long* q = (const long long*)p.ptr;
  const long long M = q[0], N = q[1], K = q[2], NB = q[3];
  const long long nkb = kblock > 0 ? (K + kblock - 1) / kblock : 0;
  if (G < 1 || kblock < 1 || r0 < 0 || r1 > NB * M || r0 > r1 || a.n < NB * M * K ||
      b.n < NB * K * N || sa.n < NB * M * nkb || ea.n < NB * M * nkb || sb.n < NB * nkb * N ||
      eb.n < NB * nkb * N || (c.ptr && c.n < NB * M * N) || d.v.len / d.v.itemsize < NB * M * N ||
      !(d.v.itemsize == 4 || d.v.itemsize == 8) || (q[6] + G - 1) / G > 128) {  // (q[6]: block)
    PyErr_SetString(PyExc_ValueError, "bfma_grouped_rows: buffer sizes do not match params / rows");
    return nullptr;
  }
  long long bad;
  PL_BEGIN_NATIVE bad = KT.bfma_grouped_rows(
      q, (const int*)o.ptr, (const double*)a.ptr, (const double*)b.ptr, (const double*)sa.ptr,
      (const double*)sb.ptr, (const int*)ea.ptr, (const int*)eb.ptr, (const float*)c.ptr, d.v.buf,
      d.v.itemsize == 4, G, kblock, nkb, r0, r1, (const double*)g.ptr);
  PL_END_NATIVE return PyLong_FromLongLong(bad);
}

PyObject* py_isa(PyObject*, PyObject*) { return PyUnicode_FromString(KT.isa); }

PyMethodDef methods[] = {
    {"gemm", py_gemm, METH_VARARGS, "gemm(params, A, B, C, SA, SB, EA, EB, D, r0, r1, flags, B32)"},
    {"gemm_fma32", py_gemm_fma32, METH_VARARGS,
     "gemm_fma32(params, A, Bp, C, D, same_out, r0, r1, grid_a=None, seg=0, a_trans=0, "
     "grid_out=None) -> "
     "non-finite count"},
    {"fma32_pack", py_fma32_pack, METH_VARARGS,
     "fma32_pack(B, Bp, K, N, q0, q1, grid=None, b_trans=0) -> inputs off the grid"},
    {"fma32_tile", py_fma32_tile, METH_NOARGS, "(MR, NR) of the fp32 FMA kernel"},
    {"bfma_info", py_bfma_info, METH_VARARGS, "bfma_info(params, opts) -> (MR, NR, units)"},
    {"fma64_rows", py_fma64_rows, METH_VARARGS, "fma64_rows(A, B, C, D, M, N, K, r0, r1)"},
    {"bfma_grouped_rows", py_bfma_grouped_rows, METH_VARARGS,
     "bfma_grouped_rows(params, opts, A, B, SA, SB, ESA, ESB, C, D, G, kblock, r0, r1, grid=None) -> bad"},
    {"pairwise32_rows", py_pairwise32_rows, METH_VARARGS,
     "pairwise32_rows(A, B, C, D, M, N, K, P, flush, r0, r1)"},
    {"exact_block_rows", py_exact_block_rows, METH_VARARGS,
     "exact_block_rows(A, B, C, D, M, N, K, block, r0, r1)"},
    {"bfma_pack_b", py_bfma_pack_b, METH_VARARGS,
     "bfma_pack_b(params, opts, B, Bs, Be, OB, q0, q1, grid=None, sexp=None) -> (bad, spread)"},
    {"bfma_rows", py_bfma_rows, METH_VARARGS,
     "bfma_rows(params, opts, A, Bs, Be, OB, C, D, r0, r1, grid_a, spread_b, sexp=None) -> bad"},
    {"align_exponents", py_align_exponents, METH_VARARGS, "align_exponents(x, emin, out)"},
    {"quantize", py_quantize, METH_VARARGS,
     "quantize(x, out, out_code, C, inner, S, Z, mode, short, torch, qmin, qmax, lo, hi)"},
    {"dequantize", py_dequantize, METH_VARARGS,
     "dequantize(q, q_code, out, short, C, inner, S, Z, lo, hi)"},
    {"blocks", py_blocks, METH_VARARGS, "blocks(x, out, dims, rule, mode, ...): see blocks.inc"},
    {"block_amax", py_block_amax, METH_VARARGS, "block_amax(x, dims, out, u0, u1) -> float"},
    {"hadamard", py_hadamard, METH_VARARGS,
     "hadamard(x, out, n, signs, inverse, c, b0, b1): blockwise float32 FWHT (hadamard.inc)"},
    {"hadamard_exact64", py_hadamard_exact64, METH_VARARGS,
     "hadamard_exact64(x, out, flags, n, signs, b0, b1): float64 butterflies of float32 blocks"},
    {"hadamard_exact32", py_hadamard_exact32, METH_VARARGS,
     "hadamard_exact32(x, out, flags, n, C, signs, inverse, odd, c1, c2, b0, b1): the exact "
     "transform of float32 blocks (n values C apart) rounded to float64, then float32"},
    {"isa", py_isa, METH_NOARGS, "instruction set of the kernels in use"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "precision_lab.backends._native_kernels",
                         "GEMM model kernels of precision_lab on the CPU", -1, methods};

}  // namespace

#ifndef PL_SOURCE_HASH
#define PL_SOURCE_HASH "unknown"  // setup.py defines the hash of the sources (native/sources.py)
#endif

PyMODINIT_FUNC PyInit__native_kernels(void) {
#if defined(PL_HAVE_AVX2)
  // PRECISION_LAB_NATIVE_ISA=baseline forces the baseline kernels, =avx2 the AVX2 ones without
  // the AVX-512 fp32 GEMM (tests run all)
  const char* want = getenv("PRECISION_LAB_NATIVE_ISA");
  const bool baseline = want && strcmp(want, "baseline") == 0;
  const bool no512 = baseline || (want && strcmp(want, "avx2") == 0);
  __builtin_cpu_init();
  if (!baseline && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    KT = {pl_avx2::k_gemm_rows, pl_avx2::k_align_exps, pl_avx2::k_fma64_rows, pl_avx2::k_exact_block_rows, pl_avx2::k_pairwise32_rows, pl_avx2::k_fma32_pack, pl_avx2::k_fma32_rows, pl_avx2::k_fma32_tile, pl_avx2::k_bfma_info, pl_avx2::k_bfma_pack_b, pl_avx2::k_bfma_rows, pl_avx2::k_bfma_grouped_rows, pl_avx2::k_quantize, pl_avx2::k_dequantize, pl_avx2::k_blocks, pl_avx2::k_block_amax, pl_avx2::k_hadamard, pl_avx2::k_hadamard_exact64, pl_avx2::k_hadamard_exact32, "avx2+fma"};
    if (!no512 && __builtin_cpu_supports("avx512f")) {  // (checks the OS saves zmm state too)
      KT.fma32_pack = pl_avx512::k_fma32_pack;
      KT.fma32_rows = pl_avx512::k_fma32_rows;
      KT.fma32_tile = pl_avx512::k_fma32_tile;
      KT.fma64_rows = pl_avx512::k_fma64_rows;
      KT.exact_block_rows = pl_avx512::k_exact_block_rows;
      KT.pairwise32_rows = pl_avx512::k_pairwise32_rows;
      KT.bfma_info = pl_avx512::k_bfma_info;
      KT.bfma_pack_b = pl_avx512::k_bfma_pack_b;
      KT.bfma_rows = pl_avx512::k_bfma_rows;
      KT.bfma_grouped_rows = pl_avx512::k_bfma_grouped_rows;
      KT.isa = "avx2+fma, avx512f gemm";
    }
  }
#endif
  PyObject* m = PyModule_Create(&moduledef);
  if (m == nullptr) return nullptr;
  if (PyModule_AddStringConstant(m, "SOURCE_HASH", PL_SOURCE_HASH) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
