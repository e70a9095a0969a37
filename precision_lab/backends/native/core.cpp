// core.cpp: precision_lab._native, the compiled CPU backend of round_to, encode and decode.
//
// The arithmetic is the CUDA kernels' own: precision_lab/cuda/pl_round.cuh compiled as plain C++.
// Its per-element routines (pl_round_bits, pl_encode_rounded, pl_decode, pl_round_int) are the
// exact reference; this file adds what makes them fast on a CPU:
//
// - Blocks of BLOCK elements go through a tight, branch-free loop per rounding mode that rounds
//   the common case (magnitude within the format's normal range) by an integer add-and-mask on the
//   bit pattern, exactly as precision_lab/rounding.py does, and flags the other elements
//   (subnormal results, overflow, inf, NaN, negative inputs of unsigned formats). The compiler
//   vectorises these loops. A block with flagged elements gets a second vectorised pass: inputs
//   below the smallest normal are rounded to the fixed quantum there by an integer rounding of
//   their bit patterns with a per-element shift (the header's pl_low_fast / pl_low_code, every
//   mode; the stochastic ones read the element's full random word), overflows and infinities by
//   a compare and select. Only what is left (NaN, negative inputs of unsigned formats, formats
//   without a fixed quantum below their smallest normal) is redone by the header's exact
//   routine.
//   Rounding modes this file does not know (added to the header later) take the per-element
//   routine for every element.
// - Stochastic rounding uses the header's Philox4x64-10 words (pl_random_group's, from its round
//   pl_philox4x64_round with the round keys computed once per call: fill_random), keyed by
//   (seed, flat index) like precision_lab/_random.py, so chunking and threads do not matter. The
//   fast path gets each word already cut to its addend, in the working type's width; the exact
//   routine gets the full words (block_random).
// - round_to and encode share their passes over a block; what they store (result bits or codes)
//   is a template parameter (store_bits, store_codes).
// - float16 input is widened exactly to the working type; codes are written as uint8/16/32/64;
//   decode of formats of at most 16 bits is a lookup in a table the caller passes in.
// - Every entry point works on a range [lo, hi) of flat, C-contiguous buffers and releases the
//   GIL, so precision_lab.native spreads chunks of a large array over its thread pool.
//
// Python API (all buffers C-contiguous and native-endian; the itemsizes tell their dtypes: 2/4/8
// for float16/32/64 input, 4/8 for float32/64 output, 1/2/4/8 for uint codes; see the methods'
// docstrings and precision_lab/native/__init__.py). Each works on elements [lo, hi):
//   round_float / round_int: values rounded to the format, in the output's float type;
//   encode_float / encode_int: codes; they return 1 if a NaN met a format without a NaN code;
//   decode_table / decode_float / decode_int: values of codes; they return 1 if a code is out of
//   range (the caller then lets the numpy backend raise the error);
//   elementwise: add/sub/mul/fma/div/sqrt of float32/float16/bfloat16 operands correctly rounded to a
//   format whose values fit in float32 (precision_lab.ops; float32 results).
//   random_words: the random words stochastic rounding gives to a range of flat indices (tests).
// fmt is the tuple (exponent_bits, mantissa_bits, bias, nan_style, flags) of
// precision_lab.gpu.format_args; mode is the index in precision_lab.rounding.ROUNDING_MODES.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "core.inc"
#include "fpenv.h"

#ifndef PL_SOURCE_HASH
#define PL_SOURCE_HASH "unknown"
#endif

namespace {

// ----- buffers from Python ----------------------------------------------------------------------
struct buffer {
  Py_buffer view;
  bool held = false;
  ~buffer() {
    if (held) PyBuffer_Release(&view);
  }
  bool get(PyObject* obj, bool writable, const char* name) {
    if (PyObject_GetBuffer(obj, &view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) {
      PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous%s buffer", name,
                   writable ? " writable" : "");
      return false;
    }
    held = true;
    return true;
  }
};

// Checks lo <= hi <= elements of each buffer, given their itemsizes.
bool check_range(Py_ssize_t lo, Py_ssize_t hi, const buffer& a, int asize, const buffer& b,
                 int bsize) {
  if (lo < 0 || hi < lo || a.view.len < hi * asize || b.view.len < hi * bsize) {
    PyErr_Format(PyExc_ValueError, "range [%zd, %zd) outside the buffers", lo, hi);
    return false;
  }
  return true;
}

bool check_size(int size, const char* name, int a, int b, int c, int d) {
  if (size == a || size == b || size == c || size == d) return true;
  PyErr_Format(PyExc_ValueError, "unsupported itemsize %d of %s", size, name);
  return false;
}

pl_format parse_format(PyObject* t, bool* ok) {
  int e = 0, m = 0, bias = 0, nan = 0, flags = 0;
  *ok = PyArg_ParseTuple(t, "iiiii", &e, &m, &bias, &nan, &flags) != 0;
  return pl_make_format(e, m, bias, nan, flags);
}

pl_sr_key make_key(unsigned long long lo, unsigned long long hi, int random_bits) {
  pl_sr_key k;
  k.seed_lo = lo;
  k.seed_hi = hi;
  k.random_bits = random_bits;
  return k;
}

// round_float / encode_float share their arguments; `encode` selects the operation.
PyObject* float_op(PyObject* args, bool encode) {
  PyObject *src_obj, *out_obj, *fmt_obj;
  int src_size, out_size, mode, saturate, flush, random_bits;
  unsigned long long seed_lo, seed_hi;
  Py_ssize_t lo, hi;
  if (!PyArg_ParseTuple(args, "OiOiOiiiKKinn", &src_obj, &src_size, &out_obj, &out_size, &fmt_obj,
                        &mode, &saturate, &flush, &seed_lo, &seed_hi, &random_bits, &lo, &hi))
    return NULL;
  bool ok;
  const pl_format f = parse_format(fmt_obj, &ok);
  if (!ok) return NULL;
  buffer src, out;
  if (!src.get(src_obj, false, "src") || !out.get(out_obj, true, "out")) return NULL;
  if (!check_size(src_size, "src", 2, 4, 8, 8) ||
      !(encode ? check_size(out_size, "out", 1, 2, 4, 8) : check_size(out_size, "out", 4, 8, 4, 8)))
    return NULL;
  if (!check_range(lo, hi, src, src_size, out, out_size)) return NULL;
  // (64-bit codes only exist for formats beyond float32: with float32's working type, codes of
  // at most 32 bits; the float64 passes give the same codes)
  const bool wide =
      encode ? !pl_fits_float32(f) || src_size == 8 || out_size == 8 : out_size == 8;
  const pl_sr_key key = make_key(seed_lo, seed_hi, random_bits);
  const void* s = src.view.buf;
  void* d = out.view.buf;
  int err = 0;
  const size_t a = (size_t)lo, b = (size_t)hi;
  PL_BEGIN_NATIVE;  // the passes live in translation units of their own (core.inc)
  if (encode && wide)
    err = pl_core::encode_float64(f, mode, saturate, flush, key, s, src_size, d, out_size, a, b);
  else if (encode)
    err = pl_core::encode_float32(f, mode, saturate, flush, key, s, src_size, d, out_size, a, b);
  else if (wide)
    pl_core::round_float64(f, mode, saturate, flush, key, s, src_size, d, a, b);
  else
    pl_core::round_float32(f, mode, saturate, flush, key, s, src_size, d, a, b);
  PL_END_NATIVE;
  return PyLong_FromLong(err);
}

PyObject* round_float(PyObject*, PyObject* args) { return float_op(args, false); }
PyObject* encode_float(PyObject*, PyObject* args) { return float_op(args, true); }

// Integer formats: the header's per-element routine (one double rounding per element).
PyObject* int_op(PyObject* args, bool encode) {
  PyObject *src_obj, *out_obj;
  int src_size, out_size, bits, is_signed, mode, random_bits;
  unsigned long long seed_lo, seed_hi;
  Py_ssize_t lo, hi;
  if (!PyArg_ParseTuple(args, "OiOiiiiKKinn", &src_obj, &src_size, &out_obj, &out_size, &bits,
                        &is_signed, &mode, &seed_lo, &seed_hi, &random_bits, &lo, &hi))
    return NULL;
  buffer src, out;
  if (!src.get(src_obj, false, "src") || !out.get(out_obj, true, "out")) return NULL;
  if (!check_size(src_size, "src", 2, 4, 8, 8) ||
      !(encode ? check_size(out_size, "out", 1, 2, 4, 8) : check_size(out_size, "out", 4, 8, 4, 8)))
    return NULL;
  if (!check_range(lo, hi, src, src_size, out, out_size)) return NULL;
  const pl_sr_key key = make_key(seed_lo, seed_hi, random_bits);
  const void* s = src.view.buf;
  void* d = out.view.buf;
  int err = 0;
  PL_BEGIN_NATIVE;
  pl_u64 rw[BLOCK];
  for (size_t i0 = (size_t)lo; i0 < (size_t)hi; i0 += BLOCK) {
    const int n = (int)((size_t)hi - i0 < (size_t)BLOCK ? (size_t)hi - i0 : (size_t)BLOCK);
    if (mode >= PL_SR) fill_words(key, i0, n, rw);
    for (int i = 0; i < n; ++i) {
      const size_t k = i0 + (size_t)i;
      const double v = pl_round_int(load_double(s, src_size, k), bits, is_signed, mode,
                                    mode >= PL_SR ? rw[i] : 0);
      if (!encode) {
        if (out_size == 4) ((pl_u32*)d)[k] = pl_traits<float>::bits_from_double(v);
        else ((pl_u64*)d)[k] = pl_traits<double>::bits_from_double(v);
      } else {
        const pl_u64 code = pl_encode_int(v, bits, &err);
        if (out_size == 1) ((pl_u8*)d)[k] = (pl_u8)code;
        else if (out_size == 2) ((pl_u16*)d)[k] = (pl_u16)code;
        else if (out_size == 4) ((pl_u32*)d)[k] = (pl_u32)code;
        else ((pl_u64*)d)[k] = code;
      }
    }
  }
  PL_END_NATIVE;
  return PyLong_FromLong(err);
}

PyObject* round_int(PyObject*, PyObject* args) { return int_op(args, false); }
PyObject* encode_int(PyObject*, PyObject* args) { return int_op(args, true); }

// ----- decode -----------------------------------------------------------------------------------
// Code i as an unsigned 64-bit number (negative signed codes become huge: out of range).
inline pl_u64 load_code(const void* codes, int size, bool is_signed, size_t i) {
  switch (size) {
    case 1:
      return is_signed ? (pl_u64)(pl_i64)((const signed char*)codes)[i] : ((const pl_u8*)codes)[i];
    case 2:
      return is_signed ? (pl_u64)(pl_i64)((const short*)codes)[i] : ((const pl_u16*)codes)[i];
    case 4:
      return is_signed ? (pl_u64)(pl_i64)((const int*)codes)[i] : ((const pl_u32*)codes)[i];
    default:
      return ((const pl_u64*)codes)[i];
  }
}

template <typename C, typename T>
PL_CLONES pl_u64 lookup(const C* codes, const T* table, pl_u64 size, T* out, size_t lo, size_t hi) {
  pl_u64 bad = 0;
  const pl_u64 mask = size - 1;
  for (size_t i = lo; i < hi; ++i) {
    const pl_u64 c = (pl_u64)codes[i];
    bad |= c & ~mask;
    out[i] = table[c & mask];
  }
  return bad;
}

template <typename T>
pl_u64 lookup_any(const void* codes, int size, bool is_signed, const T* table, pl_u64 tsize,
                  T* out, size_t lo, size_t hi) {
  switch (size) {  // signed codes are sign-extended: negative ones are out of range
    case 1:
      return is_signed ? lookup((const signed char*)codes, table, tsize, out, lo, hi)
                       : lookup((const pl_u8*)codes, table, tsize, out, lo, hi);
    case 2:
      return is_signed ? lookup((const short*)codes, table, tsize, out, lo, hi)
                       : lookup((const pl_u16*)codes, table, tsize, out, lo, hi);
    case 4:
      return is_signed ? lookup((const int*)codes, table, tsize, out, lo, hi)
                       : lookup((const pl_u32*)codes, table, tsize, out, lo, hi);
    default:
      return is_signed ? lookup((const pl_i64*)codes, table, tsize, out, lo, hi)
                       : lookup((const pl_u64*)codes, table, tsize, out, lo, hi);
  }
}

PyObject* decode_table(PyObject*, PyObject* args) {
  PyObject *codes_obj, *table_obj, *out_obj;
  int code_size, code_signed, out_size;
  Py_ssize_t lo, hi;
  if (!PyArg_ParseTuple(args, "OipOOinn", &codes_obj, &code_size, &code_signed, &table_obj,
                        &out_obj, &out_size, &lo, &hi))
    return NULL;
  buffer codes, table, out;
  if (!codes.get(codes_obj, false, "codes") || !table.get(table_obj, false, "table") ||
      !out.get(out_obj, true, "out"))
    return NULL;
  if (!check_size(code_size, "codes", 1, 2, 4, 8) || !check_size(out_size, "out", 4, 8, 4, 8) ||
      !check_range(lo, hi, codes, code_size, out, out_size))
    return NULL;
  const pl_u64 tsize = (pl_u64)(table.view.len / out_size);
  if (tsize == 0 || (tsize & (tsize - 1)) != 0) {
    PyErr_SetString(PyExc_ValueError, "table size must be a power of two");
    return NULL;
  }
  pl_u64 bad;
  PL_BEGIN_NATIVE;
  if (out_size == 4)
    bad = lookup_any(codes.view.buf, code_size, code_signed, (const pl_u32*)table.view.buf, tsize,
                     (pl_u32*)out.view.buf, (size_t)lo, (size_t)hi);
  else
    bad = lookup_any(codes.view.buf, code_size, code_signed, (const pl_u64*)table.view.buf, tsize,
                     (pl_u64*)out.view.buf, (size_t)lo, (size_t)hi);
  PL_END_NATIVE;
  return PyLong_FromLong(bad != 0);
}

// Formats wider than 16 bits: the header's pl_decode / pl_decode_int per element.
PyObject* decode_op(PyObject* args, bool integer) {
  PyObject *codes_obj, *out_obj, *fmt_obj = NULL;
  int code_size, code_signed, out_size, bits = 0, is_signed = 0;
  Py_ssize_t lo, hi;
  bool ok = true;
  pl_format f = pl_make_format(0, 0, 0, 0, 0);
  if (integer) {
    if (!PyArg_ParseTuple(args, "OipOiiinn", &codes_obj, &code_size, &code_signed, &out_obj,
                          &out_size, &bits, &is_signed, &lo, &hi))
      return NULL;
  } else {
    if (!PyArg_ParseTuple(args, "OipOiOnn", &codes_obj, &code_size, &code_signed, &out_obj,
                          &out_size, &fmt_obj, &lo, &hi))
      return NULL;
    f = parse_format(fmt_obj, &ok);
    if (!ok) return NULL;
    bits = pl_total_bits(f);
  }
  buffer codes, out;
  if (!codes.get(codes_obj, false, "codes") || !out.get(out_obj, true, "out")) return NULL;
  if (!check_size(code_size, "codes", 1, 2, 4, 8) || !check_size(out_size, "out", 4, 8, 4, 8) ||
      !check_range(lo, hi, codes, code_size, out, out_size))
    return NULL;
  const pl_u64 limit = bits >= 64 ? ~0ULL : (1ULL << bits) - 1;
  pl_u64 bad = 0;
  const void* c = codes.view.buf;
  void* d = out.view.buf;
  PL_BEGIN_NATIVE;
  for (size_t i = (size_t)lo; i < (size_t)hi; ++i) {
    const pl_u64 code = load_code(c, code_size, code_signed != 0, i);
    bad |= (code > limit) | (code_signed && (code >> 63));  // negative signed codes too
    const double v = integer ? pl_decode_int(code & limit, bits, is_signed) : pl_decode(f, code & limit);
    if (out_size == 4) ((pl_u32*)d)[i] = pl_traits<float>::bits_from_double(v);
    else ((pl_u64*)d)[i] = pl_traits<double>::bits_from_double(v);
  }
  PL_END_NATIVE;
  return PyLong_FromLong(bad != 0);
}

PyObject* decode_float(PyObject*, PyObject* args) { return decode_op(args, false); }
PyObject* decode_int(PyObject*, PyObject* args) { return decode_op(args, true); }

// ----- elementwise arithmetic of precision_lab.ops (add, sub, mul, fma) --------------------------
// Operands are float32 values (float32, float16 or bfloat16 input, widened exactly); the format's
// values fit in float32. Each operand is first put on the format's grid (nearest_even with the
// call's switches; infinities kept under saturate in formats that have them), as
// precision_lab.ops does; then the exact result is formed in double: a product of two float32
// values is exact in double, a sum (or product plus addend) is a TwoSum pair s + t collapsed by
// round-to-odd to 53 bits (exact for targets of at most 51 significant bits); that double is
// rounded once by the header (fast path plus pl_round_bits for flagged elements).
// div and sqrt: the double quotient or root q = RN(x / y) or RN(sqrt(x)) and the exact
// remainder x - q * y (x - q * q) by fma (exact: the operands are float32 values, so nothing
// underflows) give the round-to-odd collapse of the exact result, as for sums.
enum { PL_OP_ADD = 0, PL_OP_SUB = 1, PL_OP_MUL = 2, PL_OP_FMA = 3, PL_OP_DIV = 4, PL_OP_SQRT = 5 };

// Bits of elements [i0, i0 + n) of an operand as float32 (kind: 4 float32, 2 float16, 3 bfloat16).
PL_INLINE const pl_u32* load_operand(const void* src, int kind, size_t i0, int n, pl_u32* buf) {
  if (kind == 4) return (const pl_u32*)src + i0;
  const pl_u16* h = (const pl_u16*)src + i0;
  if (kind == 3) {
    for (int i = 0; i < n; ++i) buf[i] = (pl_u32)h[i] << 16;
  } else {
    for (int i = 0; i < n; ++i) buf[i] = half_to_float_bits(h[i]);
  }
  return buf;
}

// r = the format's value of each float32 b (the grid job: nearest_even, the call's switches)
template <int MODE>
PL_INLINE void round_f32_block(const job<float>& j, const pl_u32* __restrict b, pl_u32* __restrict r,
                            int n) {
  if (j.exact_only) {
    for (int i = 0; i < n; ++i) r[i] = pl_round_bits(j.p, b[i], 0);
    return;
  }
  if (round_block_fast<float, MODE>(j, b, r, NULL, n))
    for_flagged(j.c, b, n, [&](int i) { r[i] = pl_round_bits(j.p, b[i], 0); });
}

struct arith_job {
  job<float> grid;    // operands onto the grid
  job<double> out;    // the exact result onto the format
  job<float> out32;   // the same rounding of results that are exact in float32
  pl_plan<double> special;  // non-finite results under stochastic modes: nearest_even
  int op;
  bool on_grid;       // operands already on the grid (the format's own dtype, nothing to flush)
  bool keep_inf;      // saturate in a format with inf: infinite operands stay infinite
  bool fast32;        // try float32 first (sums; products of formats of at most 12 bits)
  arith_job(const pl_format& f, int op_, int mode, int saturate, int flush, pl_sr_key k,
            bool on_grid_)
      : grid(f, PL_RNE, saturate, flush, k),
        out(f, mode, saturate, flush, k),
        out32(f, mode, saturate, flush, k),
        special(pl_make_plan<double>(f, PL_RNE, saturate, flush)),
        op(op_),
        on_grid(on_grid_),
        keep_inf(saturate && f.has_inf),
        fast32(out32.c.s > 0 && !out32.exact_only &&
               (op_ == PL_OP_ADD || op_ == PL_OP_SUB || (op_ == PL_OP_MUL && f.mbits <= 11))) {}
};

// Operand block on the grid: a pointer to n float32 bit patterns.
PL_INLINE const pl_u32* grid_operand(const arith_job& j, const void* src, int kind, size_t i0,
                                     int n, pl_u32* buf, pl_u32* r) {
  const pl_u32* b = load_operand(src, kind, i0, n, buf);
  if (j.on_grid) return b;
  if (j.grid.c.s == 0) round_f32_block<PL_RTZ>(j.grid, b, r, n);
  else round_f32_block<PL_RNE>(j.grid, b, r, n);
  if (j.keep_inf)
    for (int i = 0; i < n; ++i) r[i] = (b[i] & 0x7FFFFFFFu) == 0x7F800000u ? b[i] : r[i];
  return r;
}

// Exact results of one block as doubles (bits in v); inexact[i] = 1 where the double is the
// round-to-odd collapse of an inexact TwoSum pair (t != 0).
PL_INLINE pl_u64 exact_block(int op, bool down, const pl_u32* __restrict a,
                             const pl_u32* __restrict b, const pl_u32* __restrict c,
                             pl_u64* __restrict v, int n) {
  pl_u64 any_inexact = 0;
  if (op == PL_OP_MUL) {
    for (int i = 0; i < n; ++i) v[i] = pl_bits_of((double)pl_f32_of(a[i]) * (double)pl_f32_of(b[i]));
    return 0;
  }
  if (op == PL_OP_DIV || op == PL_OP_SQRT) {
    for (int i = 0; i < n; ++i) {
      const double x = (double)pl_f32_of(a[i]);
      const double y = op == PL_OP_DIV ? (double)pl_f32_of(b[i]) : 0.0;
      const double q = op == PL_OP_DIV ? x / y : sqrt(x);
      const double d = op == PL_OP_DIV ? y : q;  // exact - q = rem / d (sqrt: rem / (q + root))
      const double rem = fma(-q, d, x);
      const pl_u64 qb = pl_bits_of(q);
      const pl_u64 inexact = (pl_u64)(rem != 0) & (pl_u64)(q - q == 0) & (pl_u64)(q != 0);
      const pl_u64 inward = inexact & (((pl_bits_of(rem) ^ pl_bits_of(d)) ^ qb) >> 63);
      v[i] = (qb - inward) | inexact;
      any_inexact |= inexact;
    }
    return any_inexact;
  }
  for (int i = 0; i < n; ++i) {
    double x, y;
    pl_u64 xb, yb;
    if (op == PL_OP_FMA) {
      x = (double)pl_f32_of(a[i]) * (double)pl_f32_of(b[i]);  // exact
      y = (double)pl_f32_of(c[i]);
    } else {
      x = (double)pl_f32_of(a[i]);
      y = (double)pl_f32_of(op == PL_OP_SUB ? b[i] ^ 0x80000000u : b[i]);
    }
    xb = pl_bits_of(x);
    yb = pl_bits_of(y);
    const double s = x + y;  // TwoSum
    const double bp = s - x;
    const double t = (x - (s - bp)) + (y - bp);
    const pl_u64 sb = pl_bits_of(s);
    const pl_u64 inexact = (pl_u64)(t != 0) & (pl_u64)(s - s == 0);  // finite s only
    const pl_u64 inward = inexact & ((pl_bits_of(t) ^ sb) >> 63);
    pl_u64 r = (sb - inward) | inexact;
    // an exact zero sum is -0 under `down` unless both addends are +0
    if (down) r = (s == 0 && (xb | yb) != 0) ? 0x8000000000000000ULL : r;
    v[i] = r;
    any_inexact |= inexact;
  }
  return any_inexact;
}

// Sums and products in float32, rounded by the float32 job, where float32 holds them exactly;
// redo[i] = 1 (and a nonzero return) for the others: inexact sums (TwoSum error not zero),
// products below float32's normal range or overflowing, non-finite results, and zero sums under
// `down` (their sign is the ops' rule) -- the caller redoes those in double.
template <int MODE>
PL_INLINE int float_block(const arith_job& j, bool down, bool random, const pl_u32* __restrict a,
                          const pl_u32* __restrict b, pl_u32* __restrict o,
                          const pl_u64* __restrict rw, pl_u8* __restrict redo, int n) {
  pl_u32 v[BLOCK], ra[BLOCK];
  if (MODE == PL_SR || MODE == PL_SRE) addends_of_words(rw, j.out32.sh, ra, n);
  pl_u32 any = 0;
  if (j.op == PL_OP_MUL) {
    for (int i = 0; i < n; ++i) {
      const pl_u32 am = a[i] & 0x7FFFFFFFu, bm = b[i] & 0x7FFFFFFFu;
      const pl_u32 r = pl_bits_of(pl_f32_of(a[i]) * pl_f32_of(b[i]));
      const pl_u32 m = r & 0x7FFFFFFFu;
      const pl_u32 bad = ((m < 0x00800000u) & (am != 0) & (bm != 0)) | (m >= 0x7F800000u);
      v[i] = r;
      redo[i] = (pl_u8)bad;
      any |= bad;
    }
  } else {
    const pl_u32 flip = j.op == PL_OP_SUB ? 0x80000000u : 0u;
    for (int i = 0; i < n; ++i) {
      const float x = pl_f32_of(a[i]), y = pl_f32_of(b[i] ^ flip);
      const float s = x + y;
      const float bp = s - x;
      const float t = (x - (s - bp)) + (y - bp);  // NaN for non-finite sums: redone
      const pl_u32 bad = (pl_u32)(t != 0) | (pl_u32)(down & (s == 0));
      v[i] = pl_bits_of(s);
      redo[i] = (pl_u8)bad;
      any |= bad;
    }
  }
  if (round_block_fast<float, MODE>(j.out32, v, o, ra, n))
    for_flagged(j.out32.c, v, n,
                [&](int i) { o[i] = pl_round_bits(j.out32.p, v[i], random ? rw[i] : 0); });
  return any != 0;
}

template <int MODE>
PL_CLONES int arith_range_mode(const arith_job& j, const void* xs, int xk, const void* ys, int yk,
                               const void* zs, int zk, pl_u32* dst, size_t lo, size_t hi) {
  typedef pl_u64 U;
  pl_u32 bx[BLOCK], by[BLOCK], bz[BLOCK], gx[BLOCK], gy[BLOCK], gz[BLOCK];
  U v[BLOCK], r[BLOCK], ra[BLOCK];
  pl_u64 rw[BLOCK];
  const bool random = j.out.random;
  const bool down = j.out.p.mode == PL_RDN;
  for (size_t i0 = lo; i0 < hi; i0 += BLOCK) {
    const int n = (int)(hi - i0 < (size_t)BLOCK ? hi - i0 : (size_t)BLOCK);
    const pl_u32* a = grid_operand(j, xs, xk, i0, n, bx, gx);
    const pl_u32* b = grid_operand(j, ys, yk, i0, n, by, gy);
    const pl_u32* c = j.op == PL_OP_FMA ? grid_operand(j, zs, zk, i0, n, bz, gz) : NULL;
    if (random) fill_words(j.out.key, i0, n, rw);
    // (the fast paths are not compiled for the modes after PL_SRE, which never take them: their
    // jobs are exact_only and fast32 is false)
    if constexpr (MODE <= PL_SRE) {
      if (j.fast32) {  // float32 results where exact; the others (flagged) in double
        pl_u32* o = dst + i0;
        pl_u8 redo[BLOCK + 8];
        if (float_block<MODE>(j, down, random, a, b, o, rw, redo, n)) {
          for (int i = 0; i < n; ++i) {
            if (!redo[i]) continue;
            pl_u64 e, rb;
            if (exact_block(j.op, down, a + i, b + i, NULL, &e, 1) && random) return 1;
            const bool finite = (e & 0x7FF0000000000000ULL) != 0x7FF0000000000000ULL;
            rb = random && !finite ? pl_round_bits(j.special, e, 0)
                                   : pl_round_bits(j.out.p, e, random ? rw[i] : 0);
            o[i] = pl_bits_of((float)pl_f64_of(rb));
          }
        }
        continue;
      }
    }
    if (exact_block(j.op, down, a, b, c, v, n) && random) return 1;  // needs the exact fraction
    if (MODE > PL_SRE || j.out.exact_only) {
      for (int i = 0; i < n; ++i) r[i] = pl_round_bits(j.out.p, v[i], random ? rw[i] : 0);
    } else if constexpr (MODE <= PL_SRE) {
      if (MODE == PL_SR || MODE == PL_SRE) addends_of_words(rw, j.out.sh, ra, n);
      if (round_block_fast<double, MODE>(j.out, v, r, ra, n))
        for_flagged(j.out.c, v, n, [&](int i) {
          const bool finite = (v[i] & 0x7FF0000000000000ULL) != 0x7FF0000000000000ULL;
          r[i] = random && !finite ? pl_round_bits(j.special, v[i], 0)
                                   : pl_round_bits(j.out.p, v[i], random ? rw[i] : 0);
        });
    }
    pl_u32* o = dst + i0;
    for (int i = 0; i < n; ++i) o[i] = pl_bits_of((float)pl_f64_of(r[i]));  // exact
  }
  return 0;
}

// elementwise(x, x_kind, y, y_kind, z, z_kind, out, op, fmt, mode, saturate, flush, on_grid,
// seed_lo, seed_hi, random_bits, lo, hi) -> 1 when a stochastic sum needs the exact discarded
// fraction beyond 53 bits (the caller then uses the numpy path), else 0
PyObject* elementwise(PyObject*, PyObject* args) {
  PyObject *x_obj, *y_obj, *z_obj, *out_obj, *fmt_obj;
  int xk, yk, zk, op, mode, saturate, flush, on_grid, random_bits;
  unsigned long long seed_lo, seed_hi;
  Py_ssize_t lo, hi;
  if (!PyArg_ParseTuple(args, "OiOiOiOiOiiipKKinn", &x_obj, &xk, &y_obj, &yk, &z_obj, &zk,
                        &out_obj, &op, &fmt_obj, &mode, &saturate, &flush, &on_grid, &seed_lo,
                        &seed_hi, &random_bits, &lo, &hi))
    return NULL;
  bool ok;
  const pl_format f = parse_format(fmt_obj, &ok);
  if (!ok) return NULL;
  if (op < PL_OP_ADD || op > PL_OP_SQRT) {
    PyErr_Format(PyExc_ValueError,
                 "op must be 0 (add), 1 (sub), 2 (mul), 3 (fma), 4 (div) or 5 (sqrt), got %d", op);
    return NULL;
  }
  if (!pl_fits_float32(f) || f.mbits > 23) {
    PyErr_SetString(PyExc_ValueError, "fmt: the format's values must fit in float32");
    return NULL;
  }
  buffer x, y, z, out;
  if (!x.get(x_obj, false, "x") || !y.get(y_obj, false, "y") || !z.get(z_obj, false, "z") ||
      !out.get(out_obj, true, "out"))
    return NULL;
  const int ksize[5] = {0, 0, 2, 2, 4};
  if (!check_size(xk, "x", 2, 3, 4, 4) || !check_size(yk, "y", 2, 3, 4, 4) ||
      !check_size(zk, "z", 2, 3, 4, 4) || !check_range(lo, hi, x, ksize[xk], out, 4) ||
      (op != PL_OP_SQRT && !check_range(lo, hi, y, ksize[yk], out, 4)) ||
      (op == PL_OP_FMA && !check_range(lo, hi, z, ksize[zk], out, 4)))
    return NULL;
  const arith_job j(f, op, mode, saturate, flush, make_key(seed_lo, seed_hi, random_bits),
                    on_grid != 0);
  int err = 0;
  const void *xs = x.view.buf, *ys = y.view.buf, *zs = z.view.buf;
  pl_u32* d = (pl_u32*)out.view.buf;
  PL_BEGIN_NATIVE;
  if (j.out.c.s == 0) {
    err = arith_range_mode<PL_RTZ>(j, xs, xk, ys, yk, zs, zk, d, lo, hi);
  } else {
#define PL_CALL(M) err = arith_range_mode<M>(j, xs, xk, ys, yk, zs, zk, d, lo, hi)
    PL_BY_MODE(j.out.p.mode, PL_CALL)
#undef PL_CALL
  }
  PL_END_NATIVE;
  return PyLong_FromLong(err);
}

// random_words(out, seed_lo, seed_hi, random_bits, start[, path]): out[i] = the random word of
// flat index start + i (out: a uint64 buffer), as fill_words gives it to the exact routine (the
// fast path takes its top bits: word_out); path (tests): the generator copy (PHILOX_*)
PyObject* random_words(PyObject*, PyObject* args) {
  PyObject* out_obj;
  unsigned long long seed_lo, seed_hi, start;
  int random_bits, path = PHILOX_AUTO;
  if (!PyArg_ParseTuple(args, "OKKiK|i", &out_obj, &seed_lo, &seed_hi, &random_bits, &start,
                        &path))
    return NULL;
  if (random_bits < 1 || random_bits > 64) {
    PyErr_Format(PyExc_ValueError, "random_bits must be in 1..64, got %d", random_bits);
    return NULL;
  }
  if (path != PHILOX_AUTO && !philox_has(path)) {
    PyErr_Format(PyExc_ValueError,
                 "path must be -1 (auto) or a generator this build and CPU have (0 scalar, 1 "
                 "AVX2, 2 AVX-512; see philox_paths()), got %d", path);
    return NULL;
  }
  buffer out;
  if (!out.get(out_obj, true, "out")) return NULL;
  const size_t n = (size_t)out.view.len / 8;
  if (start > ~0ULL - n) {
    PyErr_SetString(PyExc_ValueError, "start + len(out) must be below 2**64");
    return NULL;
  }
  const pl_sr_key key = make_key(seed_lo, seed_hi, random_bits);
  pl_u64* w = (pl_u64*)out.view.buf;
  PL_BEGIN_NATIVE;
  for (size_t i0 = 0; i0 < n; i0 += BLOCK)
    fill_words(key, (size_t)start + i0, (int)(n - i0 < (size_t)BLOCK ? n - i0 : (size_t)BLOCK),
               w + i0, path);
  PL_END_NATIVE;
  Py_RETURN_NONE;
}

// philox_paths() -> (paths, auto): the generator copies this build and CPU have (0 scalar, 1
// AVX2, 2 AVX-512) and the one round_to uses (for the tests)
PyObject* philox_paths(PyObject*, PyObject*) {
  PyObject* have = PyList_New(0);
  if (!have) return NULL;
  for (int path = PHILOX_SCALAR; path <= PHILOX_AVX512; ++path) {
    if (!philox_has(path)) continue;
    PyObject* v = PyLong_FromLong(path);
    if (!v || PyList_Append(have, v) != 0) {
      Py_XDECREF(v);
      Py_DECREF(have);
      return NULL;
    }
    Py_DECREF(v);
  }
  return Py_BuildValue("(Ni)", have, philox_auto());
}

// fast_paths(fmt, mode, saturate, flush, itemsize) -> (low, overflow, overflow_codes): whether
// round_to/encode with a working type of that itemsize (4: float32, 8: float64) take the fast
// paths for inputs below the smallest normal, above the max (round_to), above the max (encode).
// For the tests: they assert that the exhaustive comparisons run through these paths.
PyObject* fast_paths(PyObject*, PyObject* args) {
  PyObject* fmt_obj;
  int mode, saturate, flush, itemsize;
  if (!PyArg_ParseTuple(args, "Oiiii", &fmt_obj, &mode, &saturate, &flush, &itemsize)) return NULL;
  bool ok;
  const pl_format f = parse_format(fmt_obj, &ok);
  if (!ok || !check_size(itemsize, "itemsize", 4, 8, 4, 8)) return NULL;
  const pl_sr_key key = make_key(0, 0, 64);
  bool low, over, over_code;
  if (itemsize == 4) {
    const job<float> j(f, mode, saturate, flush, key);
    low = j.e.low_on != 0, over = j.e.over_on != 0, over_code = j.e.over_code_on != 0;
  } else {
    const job<double> j(f, mode, saturate, flush, key);
    low = j.e.low_on != 0, over = j.e.over_on != 0, over_code = j.e.over_code_on != 0;
  }
  return Py_BuildValue("(OOO)", low ? Py_True : Py_False, over ? Py_True : Py_False,
                       over_code ? Py_True : Py_False);
}

PyMethodDef methods[] = {
    {"round_float", round_float, METH_VARARGS,
     "round_float(src, src_itemsize, out, out_itemsize, fmt, mode, saturate, flush, seed_lo, "
     "seed_hi, random_bits, lo, hi): round elements lo..hi-1 of src into out"},
    {"encode_float", encode_float, METH_VARARGS,
     "encode_float(src, src_itemsize, out, code_itemsize, fmt, mode, saturate, flush, seed_lo, "
     "seed_hi, random_bits, lo, hi) -> 1 if NaN met a format without NaN"},
    {"round_int", round_int, METH_VARARGS,
     "round_int(src, src_itemsize, out, out_itemsize, bits, signed, mode, seed_lo, seed_hi, "
     "random_bits, lo, hi)"},
    {"encode_int", encode_int, METH_VARARGS,
     "encode_int(src, src_itemsize, out, code_itemsize, bits, signed, mode, seed_lo, seed_hi, "
     "random_bits, lo, hi) -> 1 if NaN met"},
    {"decode_table", decode_table, METH_VARARGS,
     "decode_table(codes, code_itemsize, code_signed, table, out, out_itemsize, lo, hi) -> 1 if a "
     "code lies outside the table"},
    {"decode_float", decode_float, METH_VARARGS,
     "decode_float(codes, code_itemsize, code_signed, out, out_itemsize, fmt, lo, hi) -> 1 if a "
     "code is out of range"},
    {"decode_int", decode_int, METH_VARARGS,
     "decode_int(codes, code_itemsize, code_signed, out, out_itemsize, bits, signed, lo, hi) -> 1 "
     "if a code is out of range"},
    {"elementwise", elementwise, METH_VARARGS,
     "elementwise(x, x_kind, y, y_kind, z, z_kind, out, op, fmt, mode, saturate, flush, on_grid, "
     "seed_lo, seed_hi, random_bits, lo, hi): float32 results of add/sub/mul/fma (op 0..3) of "
     "float32/float16/bfloat16 operands (kind 4/2/3) -> 1 if a stochastic sum needs the numpy path"},
    {"random_words", random_words, METH_VARARGS,
     "random_words(out, seed_lo, seed_hi, random_bits, start[, path]): out[i] (uint64) = the "
     "random word of flat index start + i that stochastic rounding uses; path: the generator "
     "copy (-1 auto, 0 scalar, 1 AVX2, 2 AVX-512)"},
    {"philox_paths", philox_paths, METH_NOARGS,
     "philox_paths() -> (paths, auto): the random-word generator copies this build and CPU have "
     "(0 scalar, 1 AVX2, 2 AVX-512) and the one in use"},
    {"fast_paths", fast_paths, METH_VARARGS,
     "fast_paths(fmt, mode, saturate, flush, itemsize) -> (low, overflow, overflow_codes): the "
     "fast paths a job takes outside the format's normal range (working itemsize 4 or 8)"},
    {NULL, NULL, 0, NULL}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "precision_lab.backends._native",
                          "Compiled CPU backend of round_to, encode and decode "
                          "(see precision_lab/native/core.cpp).",
                          -1, methods, NULL, NULL, NULL, NULL};

}  // namespace

PyMODINIT_FUNC PyInit__native(void) {
  PyObject* m = PyModule_Create(&module_def);
  if (m == NULL) return NULL;
  if (PyModule_AddStringConstant(m, "SOURCE_HASH", PL_SOURCE_HASH) < 0 ||
      PyModule_AddIntConstant(m, "BLOCK", BLOCK) < 0 ||
      PyModule_AddIntConstant(m, "FAST_MODES", PL_SRE + 1) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
