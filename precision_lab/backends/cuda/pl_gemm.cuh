// pl_gemm.cuh: the arithmetic of the GEMM accumulator models (precision_lab/gemm/accumulator.py).
//
// Every function is __host__ __device__ and follows the numpy reference
// (precision_lab/gemm/reference.py, precision_lab/gemm/exact.py) step by step: exact products in
// double, two-sum pairs (s, t) for every addition, one rounding of the exact sum per step
// (round-to-odd at 53 bits then the rounding core, or the core's stochastic rule on the exact
// fraction), block-FMA alignment and truncation, promotion, scales, special values and the
// stochastic-rounding event numbers. The kernels in pl_gemm.cu feed the per-element state machine
// below from shared-memory tiles; tests/test_cuda_host.py runs those kernels on the CPU
// (tests/cuda_harness/cuda_emul.h) and compares them bit for bit with the numpy reference.
#ifndef PL_GEMM_CUH
#define PL_GEMM_CUH

#include "pl_round.cuh"

// ----- one rounding step of the model (exact.Rounder) -------------------------------------------
struct pl_rounder {
  pl_plan<double> p;  // format, mode, overflow (saturate), subnormals (flush)
  int fp64_native;    // fp64 with nearest_even: the float64 sum is the answer
  int inf_over;       // overflow="infinity": from max + ulp(max) on, +-inf in every mode
  int zero_pos;       // zero_sign="positive": every zero result is +0
  double top;         // max + ulp(max) (inf for fp64)
};

PL_HD double pl_overflow_top(const pl_format& f) {
  const int emax = (int)(pl_max_code_magnitude(f) >> f.mbits) - f.bias;
  return pl_fmt_max(f) + ldexp(1.0, emax - f.mbits);
}

// A rounder of plan p with the IEEE rules (inf_over, zero_pos 0): build every pl_rounder here
// or by pl_make_rounder, so that no field is left uninitialised.
PL_HD_CALL pl_rounder pl_rounder_of(const pl_plan<double>& p, int fp64_native) {
  pl_rounder r;
  r.p = p;
  r.fp64_native = fp64_native;
  r.inf_over = 0;
  r.zero_pos = 0;
  r.top = pl_overflow_top(p.fmt);
  return r;
}

PL_HD_CALL pl_rounder pl_make_rounder(const pl_i64* q) {
  return pl_rounder_of(
      pl_make_plan<double>(pl_make_format((int)q[0], (int)q[1], (int)q[2], (int)q[3], (int)q[4]),
                           (int)q[5], (int)q[6], (int)q[7]),
      (int)q[8]);
}

// round_to(x, fmt, rounding=mode, overflow=(the rounder's), subnormals=flush ? flush : keep)
PL_HD_CALL double pl_round_with(const pl_plan<double>& p, double x, int mode, int flush) {
  pl_plan<double> q = p;
  q.mode = mode;
  q.flush = flush;
  return pl_f64_of(pl_round_bits(q, pl_bits_of(x), 0ULL));
}

PL_HD bool pl_finite(double x) {
  return (pl_bits_of(x) & 0x7FF0000000000000ULL) != 0x7FF0000000000000ULL;
}
PL_HD bool pl_signbit(double x) { return (pl_bits_of(x) >> 63) != 0; }

// Knuth's TwoSum: s = fl(x + y), s + t = x + y exactly; t = 0 when not finite (exact.two_sum).
PL_HD void pl_two_sum(double x, double y, double* s, double* t) {
  const double ss = x + y;
  const double bb = ss - x;
  const double tt = (x - (ss - bb)) + (y - bb);
  *s = ss;
  *t = pl_finite(tt) ? tt : 0.0;
}

// 53-bit round-to-odd of s + t (exact.odd_collapse).
PL_HD double pl_odd_collapse(double s, double t) {
  if (t == 0.0) return s;
  pl_i64 bits = (pl_i64)pl_bits_of(s);
  if (pl_signbit(t) != pl_signbit(s)) bits -= 1;
  return pl_f64_of((pl_u64)(bits | 1));
}

// numpy's float64 -> int64 cast on x86 (cvttsd2si): out of range and NaN give INT64_MIN.
PL_HD pl_i64 pl_cvt_i64(double x) {
  if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0)) {
    return (pl_i64)0x8000000000000000ULL;
  }
  return (pl_i64)x;
}

// The rounder's overflow="infinity" and zero-sign rules applied to `out`, the rounding of the
// exact (or 53-bit round-to-odd) z (exact.Rounder.finish): |z| >= max + ulp(max) overflows as
// round-to-nearest does (+-inf, NaN without inf), and a zero is +0 with zero_pos.
PL_HD double pl_rounder_finish(const pl_rounder& r, double z, double out) {
  if (r.inf_over && fabs(z) >= r.top) out = pl_round_with(r.p, z, PL_RNE, 0);
  if (r.zero_pos) out = out + 0.0;
  return out;
}

// Round the exact s + t onto the rounder's format once (exact.round_sum); w: the random word.
// Stochastic modes: PL_SR rounds away from zero iff frac + w >= 2**64 (frac: the exact discarded
// fraction times 2**64), PL_SRE iff the value is inexact and w's top bit is set.
PL_HD_CALL double pl_round_sum_core(const pl_rounder& r, double s, double t, pl_u64 w) {
  const pl_plan<double>& p = r.p;
  if (r.fp64_native) return pl_round_with(p, s, PL_RNE, p.flush);
  if (!pl_is_stochastic(p.mode)) return pl_round_with(p, pl_odd_collapse(s, t), p.mode, p.flush);
  const double z = pl_odd_collapse(s, t);
  const double trunc = pl_round_with(p, z, PL_RTZ, 0);
  double out;
  if (!(pl_finite(s) && pl_finite(trunc))) {
    out = pl_round_with(p, s, PL_RNE, 0);
  } else {
    const pl_format& f = p.fmt;
    const int sub_m = f.has_subnormals ? f.mbits : 0;
    int e;
    frexp(trunc, &e);
    e -= 1;
    const int qexp = (trunc != 0.0 && e >= p.emin) ? e - f.mbits : p.emin - sub_m;
    const double d1 = fabs(s) - fabs(trunc);
    const double st = pl_signbit(s) ? -t : t;
    const double d1s = ldexp(d1, 64 - qexp);
    const double ts = floor(ldexp(st, 64 - qexp));
    const pl_u64 d1u = d1s >= 18446744073709551616.0 ? 0ULL : (pl_u64)d1s;
    const pl_u64 frac = d1u + (pl_u64)pl_cvt_i64(ts);
    const bool away = frac != 0 && (p.mode == PL_SRE ? (w >> 63) != 0 : w >= 0ULL - frac);
    const double step = ldexp(pl_signbit(z) ? -1.0 : 1.0, qexp);
    // beyond the largest value plus one quantum every rounding of the unbounded grid overflows
    // (trunc was clamped to max, so frac says nothing there): overflow per the switch, as
    // round_to (and exact.round_sum) do
    const int emax = (int)(pl_max_code_magnitude(f) >> f.mbits) - f.bias;
    const double top = pl_fmt_max(f) + ldexp(1.0, emax - f.mbits);
    const bool beyond = fabs(s) > top || (fabs(s) == top && st >= 0.0);
    out = pl_round_with(p, beyond ? z : (away ? trunc + step : trunc), PL_RNE, 0);
  }
  if (p.flush) out = pl_round_with(p, out, PL_RNE, 1);
  return out;
}

PL_HD_CALL double pl_round_sum(const pl_rounder& r, double s, double t, pl_u64 w) {
  const double out = pl_round_sum_core(r, s, t, w);
  if (!(r.inf_over || r.zero_pos)) return out;
  return pl_rounder_finish(r, pl_odd_collapse(s, t), out);
}

// Rounder.round: round an exact double x.
PL_HD_CALL double pl_rounder_round(const pl_rounder& r, double x, pl_u64 w) {
  if (pl_is_stochastic(r.p.mode)) return pl_round_sum(r, x, 0.0, w);
  return pl_rounder_finish(r, x, pl_round_with(r.p, x, r.p.mode, r.p.flush));
}

// ----- numpy's float64 arithmetic on x86 (NaN signs and payloads; blocks.inc) -------------------
// A NaN operand propagates (the first one when both are), quieted; an invalid operation gives
// x86's default NaN, which is negative.
PL_HD double pl_x86_nan_result(double a, double b, double r) {
  const pl_u64 quiet = 0x0008000000000000ULL;
  if (!(a == a)) return pl_f64_of(pl_bits_of(a) | quiet);
  if (!(b == b)) return pl_f64_of(pl_bits_of(b) | quiet);
  if (!(r == r)) return pl_f64_of(0xFFF8000000000000ULL);
  return r;
}
PL_HD double pl_x86_mul(double a, double b) { return pl_x86_nan_result(a, b, a * b); }
PL_HD double pl_x86_add(double a, double b) { return pl_x86_nan_result(a, b, a + b); }

// ----- the configuration of one GEMM (built from the int64 params of cupy_backend.params) --------
enum { PL_SEQUENTIAL = 0, PL_PAIRWISE = 1, PL_BLOCKED = 2, PL_BLOCK_FMA = 3, PL_EXACT_BLOCK = 4 };
#define PL_EB_MAX 32  // the longest exact_block block of the GPU kernels (per-thread arrays)
#define PL_SEP_GROUPS 16  // the most inner blocks of a block with addend="separate" (ditto)
#define PL_GROUPS_MAX 16  // the most scale groups of a block (kind::mxf4nvf4: 4) (ditto)
enum {
  PL_P_M = 0, PL_P_N, PL_P_K, PL_P_NB, PL_P_T, PL_P_ORDER, PL_P_BLOCK, PL_P_ALIGN, PL_P_IN_BLOCK,
  PL_P_SEG, PL_P_PROMOTE, PL_P_PRODUCT, PL_P_SCALES, PL_P_SA_ROWS, PL_P_SB_COLS, PL_P_NK,
  PL_P_KBLOCK, PL_P_EMIN_A, PL_P_EMIN_B, PL_P_SEED_LO, PL_P_SEED_HI, PL_P_RBITS, PL_P_SPECIAL,
  PL_P_TK, PL_P_HAS_C, PL_P_STOCHASTIC, PL_P_INNER, PL_P_INTERLEAVE,
  PL_P_ZEROS, PL_P_ZERO_POS, PL_P_INF_OVER,  // zeros_in_anchor, zero_sign, overflow=infinity
  PL_P_SCALES_IN,  // scales="in_block" (spec 3b without groups): SA/SB enter the block FMAs
  PL_P_FMA64,      // inputs wider than 26 bits (fp64): a chain of fused multiply-adds
  PL_P_SEP,        // addend="separate" (AMD CDNA3): sum_bits + 1 (0: the addend is not)
  PL_P_SEP_DOWN,   // ... bit 0: its cuts down (floor; 0: toward zero, align_rounding);
                   // bits 1-: drop_bits (0: the running value is never dropped)
  PL_P_GROUP,      // scales="in_block" with groups (kind::mxf4nvf4): products per group (0: none)
  PL_P_SCALE_EMIN, // ... the scale format's emin (the scales' alignment exponents)
  PL_P_ZERO_EXP,   // zeros_in_anchor: the alignment exponent of zeros (zero_exponent)
  PL_P_ROUNDERS = 40,  // 6 rounders of 9 entries: acc, block, promote, scale, product, out
  // spec 3e (lanes and split-K; 0: off) and 3f
  PL_P_LANES = 40 + 6 * 9,  // lanes (0: none)
  PL_P_LANE_TAIL,           // PL_TAIL_*
  PL_P_LANE_UNROLL,         // lane_unroll (0: lanes)
  PL_P_SMALL_K,             // small_k (0: none)
  PL_P_SPLIT_K,             // split_k (0: none)
  PL_P_SPLIT_COMBINE,       // PL_SPLIT_*
  PL_P_SPLIT_BALANCE,       // split_balance (0: none)
  PL_P_K1,                  // k1_product
  PL_P_SPLIT_EQUAL,         // split_equal (0: none): equal chunks where they fit
  PL_P_LANE_VECTOR,         // lane_vector (0: none): the cleanup loop's width
  PL_P_SPLIT_HALF,          // split_half: 0 ceil(r / 2), 1 floor(r / 2) before split_balance
  PL_P_LANE_F32,            // lanes in float32: fp32 nearest_even, exact float32 inputs (fmaf)
  PL_P_TREE_LEN,            // the lane tree in postfix: tokens >= 0 lane numbers, -m: the
  PL_P_TREE,                // sum of the m values below, left to right (PL_TREE_MAX tokens)
  PL_P_SIZE = PL_P_TREE + 2 * 64
};
#define PL_LANES_MAX 64               // the most lanes (per-thread arrays)
#define PL_TREE_MAX (2 * PL_LANES_MAX)  // the most tokens of a lane tree
enum { PL_TAIL_LANES = 0, PL_TAIL_AFTER = 1, PL_TAIL_FIRST = 2, PL_TAIL_SEPARATE = 3,
       PL_TAIL_SEPARATE_FIRST = 4 };
#define PL_TREE_TAIL PL_LANES_MAX  // the tree token of separate_first's tail sum
enum { PL_SPLIT_SEQUENTIAL = 0, PL_SPLIT_PAIRWISE = 1, PL_SPLIT_HALVING = 2 };
#define PL_GEMM_NO_TERM (-(1 << 20))
#define PL_PAIR_STACK 64

struct pl_gemm_cfg {
  pl_i64 M, N, K, NB, T, seg, sa_rows, sb_cols, nk, kblock;
  int order, block, align_bits, in_block, promote, has_product, has_scales, emin_a, emin_b;
  int random_bits, has_special, tk, has_c, stochastic, inner, interleave;
  int zero_exp;  // alignment exponent of a zero product, group or running value (zero_exponent
                 // with zeros_in_anchor) or PL_GEMM_NO_TERM (zeros take no part)
  int scales_in;  // the power-of-two scales multiply each product of a block FMA (spec 3b)
  int fma64;      // sequential steps r = round(fma(a, b, r)) (FP64 DMMA, AMD f64 MFMA)
  int sep, sep_down;  // addend="separate": sum_bits + 1 (0: off); cuts down (else toward zero)
  int sep_drop;       // ... drop_bits (0: none)
  int group, scale_emin;  // block-scaled MMA with groups: products per group, the scales' emin
  // spec 3e: lanes (0: none), lane_tail, lane_unroll (0: lanes), small_k (0: none),
  // split_combine, k1_product; split_k (0: none), split_balance (0: none); the lane tree
  int lanes, lane_tail, lane_unroll, lane_vector, small_k, split_combine, k1, tree_len;
  int lane_f32;  // every step of the lanes is one IEEE float32 fmaf or addition (kernel_plan)
  pl_i64 split_k, split_balance, split_equal;
  int split_half;  // 0: ceil(r / 2) (OpenBLAS level3_thread.c), 1: floor(r / 2) (level3.c)
  int tree[PL_TREE_MAX];
  pl_u64 seed_lo, seed_hi;
  pl_rounder acc, blk, prom, scale, prod, out;
};

PL_HD_CALL void pl_gemm_load_cfg(pl_gemm_cfg* c, const pl_i64* q) {
  c->M = q[PL_P_M];
  c->N = q[PL_P_N];
  c->K = q[PL_P_K];
  c->NB = q[PL_P_NB];
  c->T = q[PL_P_T];
  c->order = (int)q[PL_P_ORDER];
  c->block = (int)q[PL_P_BLOCK];
  c->align_bits = (int)q[PL_P_ALIGN];
  c->in_block = (int)q[PL_P_IN_BLOCK];
  c->seg = q[PL_P_SEG];
  c->promote = (int)q[PL_P_PROMOTE];
  c->has_product = (int)q[PL_P_PRODUCT];
  c->has_scales = (int)q[PL_P_SCALES];
  c->sa_rows = q[PL_P_SA_ROWS];
  c->sb_cols = q[PL_P_SB_COLS];
  c->nk = q[PL_P_NK];
  c->kblock = q[PL_P_KBLOCK];
  c->emin_a = (int)q[PL_P_EMIN_A];
  c->emin_b = (int)q[PL_P_EMIN_B];
  c->seed_lo = (pl_u64)q[PL_P_SEED_LO];
  c->seed_hi = (pl_u64)q[PL_P_SEED_HI];
  c->random_bits = (int)q[PL_P_RBITS];
  c->has_special = (int)q[PL_P_SPECIAL];
  c->tk = (int)q[PL_P_TK];
  c->has_c = (int)q[PL_P_HAS_C];
  c->stochastic = (int)q[PL_P_STOCHASTIC];
  c->inner = (int)q[PL_P_INNER];
  c->interleave = (int)q[PL_P_INTERLEAVE];
  c->acc = pl_make_rounder(q + PL_P_ROUNDERS + 0 * 9);
  c->blk = pl_make_rounder(q + PL_P_ROUNDERS + 1 * 9);
  c->prom = pl_make_rounder(q + PL_P_ROUNDERS + 2 * 9);
  c->scale = pl_make_rounder(q + PL_P_ROUNDERS + 3 * 9);
  c->prod = pl_make_rounder(q + PL_P_ROUNDERS + 4 * 9);
  c->out = pl_make_rounder(q + PL_P_ROUNDERS + 5 * 9);
  c->zero_exp = q[PL_P_ZEROS] ? (int)q[PL_P_ZERO_EXP] : PL_GEMM_NO_TERM;
  c->scales_in = (int)q[PL_P_SCALES_IN];
  c->fma64 = (int)q[PL_P_FMA64];
  c->sep = (int)q[PL_P_SEP];
  c->sep_down = (int)(q[PL_P_SEP_DOWN] & 1);
  c->sep_drop = (int)(q[PL_P_SEP_DOWN] >> 1);
  c->group = (int)q[PL_P_GROUP];
  c->scale_emin = (int)q[PL_P_SCALE_EMIN];
  c->lanes = (int)q[PL_P_LANES];
  c->lane_tail = (int)q[PL_P_LANE_TAIL];
  c->lane_unroll = (int)q[PL_P_LANE_UNROLL];
  c->lane_vector = (int)q[PL_P_LANE_VECTOR];
  c->small_k = (int)q[PL_P_SMALL_K];
  c->split_k = q[PL_P_SPLIT_K];
  c->split_combine = (int)q[PL_P_SPLIT_COMBINE];
  c->split_balance = q[PL_P_SPLIT_BALANCE];
  c->split_equal = q[PL_P_SPLIT_EQUAL];
  c->split_half = (int)q[PL_P_SPLIT_HALF];
  c->k1 = (int)q[PL_P_K1];
  c->lane_f32 = (int)q[PL_P_LANE_F32];
  c->tree_len = (int)q[PL_P_TREE_LEN];
  for (int i = 0; i < PL_TREE_MAX; ++i) c->tree[i] = i < c->tree_len ? (int)q[PL_P_TREE + i] : 0;
  pl_rounder* all[6] = {&c->acc, &c->blk, &c->prom, &c->scale, &c->prod, &c->out};
  for (int i = 0; i < 6; ++i) {
    all[i]->zero_pos = (int)q[PL_P_ZERO_POS];
    all[i]->inf_over = (int)q[PL_P_INF_OVER];
  }
}

// ----- the state of one output element -----------------------------------------------------------
struct pl_gemm_elem {
  pl_u64 idx;      // flat output index (C order over batch x M x N)
  double W;        // the (promoted) result
  double s0;       // the segment's starting value (c without promotion)
  int has_s0;
  double acc;      // sequential: running sum; blocked: running total; block_fma: r
  double bsum;     // blocked: the current block's sum
  // pairwise: a stack of (level, index, value) and the event offsets of the segment's levels
  int depth;
  int lev[PL_PAIR_STACK];
  pl_i64 q[PL_PAIR_STACK];
  double val[PL_PAIR_STACK];
  pl_i64 offsets[PL_PAIR_STACK];
};

// The random word of rounding event `event` of this element (word event * T + idx).
PL_HD pl_u64 pl_gemm_word(const pl_gemm_cfg& c, const pl_rounder& r, pl_i64 event, pl_u64 idx) {
  if (!pl_is_stochastic(r.p.mode)) return 0ULL;
  return pl_random_word((pl_u64)event * (pl_u64)c.T + idx, c.seed_lo, c.seed_hi, c.random_bits);
}

// round(x + y) onto r's format, one rounding of the exact sum (reference._Model._add).
PL_HD_CALL double pl_gemm_add(const pl_gemm_cfg& c, const pl_rounder& r, double x, double y,
                         pl_i64 event, pl_u64 idx) {
  double s, t;
  // an exact zero sum is -0 under round-down (IEEE 754 6.3): the negated sum of the negations
  // (round-to-nearest is symmetric, so only zero signs change), as reference._Model._add
  const double sg = r.p.mode == PL_RDN ? -1.0 : 1.0;
  pl_two_sum(sg * x, sg * y, &s, &t);
  return pl_round_sum(r, sg * s, sg * t, pl_gemm_word(c, r, event, idx));
}

// An addition of the model with special values (spec section 5): infinities and NaNs in the
// inputs (has_special) are never rounded: a step with one gives the IEEE sum (reference._add).
PL_HD_CALL double pl_gemm_add_sp(const pl_gemm_cfg& c, const pl_rounder& r, double x, double y,
                                 pl_i64 event, pl_u64 idx) {
  if (c.has_special && !(pl_finite(x) && pl_finite(y))) return x + y;
  return pl_gemm_add(c, r, x, y, event, idx);
}

PL_HD double pl_model_value(const pl_gemm_cfg& c, double v) {
  return (c.has_special && !pl_finite(v)) ? 0.0 : v;
}

// The model's product of inputs a and b at index k (exact, or rounded to the product format);
// an infinite or NaN input gives the IEEE product, unrounded (reference._product).
PL_HD double pl_gemm_product(const pl_gemm_cfg& c, double a, double b, pl_i64 k, pl_u64 idx) {
  double p = pl_model_value(c, a) * pl_model_value(c, b);
  if (c.has_product) p = pl_rounder_round(c.prod, p, pl_gemm_word(c, c.prod, 4 * c.K + k, idx));
  if (c.has_special) {
    const double raw = a * b;
    if (!pl_finite(raw)) p = raw;
  }
  return p;
}

PL_HD void pl_gemm_begin(const pl_gemm_cfg& c, pl_gemm_elem* e, pl_u64 idx, double cval) {
  (void)c;
  e->idx = idx;
  e->W = cval;
  e->depth = 0;
}

PL_HD_CALL void pl_gemm_begin_segment(const pl_gemm_cfg& c, pl_gemm_elem* e, pl_i64 k0, pl_i64 k1) {
  e->has_s0 = !c.promote;
  e->s0 = e->W;
  e->acc = e->has_s0 ? e->s0 : 0.0;
  e->bsum = 0.0;
  e->depth = 0;
  if (c.order == PL_PAIRWISE) {  // event offsets of the levels of the pairwise tree
    pl_i64 count = k1 - k0;
    e->offsets[0] = 0;
    e->offsets[1] = 0;
    int lev = 1;
    while (count > 1 && lev + 1 < PL_PAIR_STACK) {
      e->offsets[lev + 1] = e->offsets[lev] + count / 2;
      count = (count + 1) / 2;
      ++lev;
    }
  }
}

// Push a pairwise node; merge with left siblings (events k0 + offsets[level] + index).
PL_HD_CALL void pl_pair_push(const pl_gemm_cfg& c, pl_gemm_elem* e, pl_i64 k0, int lev, pl_i64 q,
                        double v) {
  while (e->depth > 0 && e->lev[e->depth - 1] == lev) {
    const double x = e->val[e->depth - 1];
    --e->depth;
    ++lev;
    q /= 2;
    v = pl_gemm_add_sp(c, c.acc, x, v, k0 + e->offsets[lev] + q, e->idx);
  }
  e->lev[e->depth] = lev;
  e->q[e->depth] = q;
  e->val[e->depth] = v;
  ++e->depth;
}

// Streaming orders: feed the product of a and b at global index k of segment [k0, k1).
PL_HD_CALL void pl_gemm_feed(const pl_gemm_cfg& c, pl_gemm_elem* e, pl_i64 k0, pl_i64 k1, pl_i64 k,
                        double a, double b) {
  if (c.fma64) {  // (reference._fma64: IEEE fusedMultiplyAdd, special values included)
    e->acc = pl_rounder_round(c.acc, fma(a, b, e->acc), pl_gemm_word(c, c.acc, k, e->idx));
    return;
  }
  const double p = pl_gemm_product(c, a, b, k, e->idx);
  if (c.order == PL_SEQUENTIAL) {
    e->acc = pl_gemm_add_sp(c, c.acc, e->acc, p, k, e->idx);
  } else if (c.order == PL_BLOCKED) {
    const pl_i64 pos = (k - k0) % c.block;
    if (pos == 0) e->bsum = 0.0;
    e->bsum = pl_gemm_add_sp(c, c.acc, e->bsum, p, k, e->idx);
    if (pos == c.block - 1 || k == k1 - 1) {
      const pl_i64 j0 = k - pos;
      e->acc = pl_gemm_add_sp(c, c.acc, e->acc, e->bsum, c.K + j0 / c.block, e->idx);
    }
  } else {  // pairwise
    pl_pair_push(c, e, k0, 0, k - k0, p);
  }
}

// Alignment exponent max(floor(log2|x|), emin); `zero` for zero (PL_GEMM_NO_TERM: no part;
// the accumulator's zero_exponent with zeros_in_anchor).
PL_HD int pl_align_exp(double x, int emin, int zero = PL_GEMM_NO_TERM) {
  if (x == 0.0) return zero;
  int e;
  frexp(x, &e);
  e -= 1;
  return e > emin ? e : emin;
}

// The scales of segment [k0, ...) (or of product k0) for output (batch, row, col).
PL_HD void pl_gemm_scales(const pl_gemm_cfg& c, const double* SA, const double* SB, pl_i64 batch,
                          pl_i64 row, pl_i64 col, pl_i64 k0, double* sa, double* sb) {
  *sa = 1.0;
  *sb = 1.0;
  if (!c.has_scales) return;
  const pl_i64 kb = c.kblock ? k0 / c.kblock : 0;
  const pl_i64 kbi = c.nk > 1 ? kb : 0;
  *sa = SA[(batch * c.sa_rows + (c.sa_rows > 1 ? row : 0)) * c.nk + kbi];
  *sb = SB[(batch * c.nk + kbi) * c.sb_cols + (c.sb_cols > 1 ? col : 0)];
}

// The scales of the products of a block FMA with scales="in_block" (spec 3b without groups):
// product i of the block is product k0 + i of output (batch, row, col).
struct pl_gemm_sc {
  const double* SA;
  const double* SB;
  pl_i64 batch, row, col, k0;
};

// The exact sum X of one block FMA (reference._Model._fma_sum): the products i (0 <= i < n) of
// group g ((i / q) % groups == g; every product when groups == 1) and, with has_r, the running
// value r, aligned to the largest alignment exponent and truncated to align_bits fraction bits.
// With sc (scales="in_block", reference._Model._scaled_terms): each product times its
// power-of-two scales sa * sb (exact), the alignment exponent of a non-zero a (b) raised by
// log2(sa) (log2(sb)); a zero product takes c.zero_exp, not scaled (MMA-Sim's e_zero).
PL_HD void pl_fma_scales(const pl_gemm_cfg& c, const pl_gemm_sc* sc, int i, double* s,
                         int* sha, int* shb) {
  *s = 1.0;
  *sha = *shb = 0;
  if (!sc) return;
  double sa, sb;
  pl_gemm_scales(c, sc->SA, sc->SB, sc->batch, sc->row, sc->col, sc->k0 + i, &sa, &sb);
  frexp(sa, sha);
  frexp(sb, shb);
  *sha -= 1;
  *shb -= 1;
  *s = sa * sb;
}

// anchor (or null): E, the largest alignment exponent (PL_GEMM_NO_TERM: no term).
PL_HD_CALL double pl_fma_sum(const pl_gemm_cfg& c, const double* a, int as, const double* b,
                             int bs, int n, int g, int groups, int q, bool has_r, double r,
                             const pl_gemm_sc* sc = nullptr, int* anchor = nullptr) {
  int E = PL_GEMM_NO_TERM;
  for (int i = 0; i < n; ++i) {
    if (groups > 1 && (i / q) % groups != g) continue;
    const double va = pl_model_value(c, a[i * as]), vb = pl_model_value(c, b[i * bs]);
    int ep = c.sep ? PL_GEMM_NO_TERM : c.zero_exp;  // a zero product ("separate": no part)
    if (va != 0.0 && vb != 0.0) {
      ep = pl_align_exp(va, c.emin_a) + pl_align_exp(vb, c.emin_b);
      if (sc) {
        double s;
        int sha, shb;
        pl_fma_scales(c, sc, i, &s, &sha, &shb);
        ep += sha + shb;
      }
    }
    if (ep > E) E = ep;
  }
  const double rr = pl_finite(r) ? r : 0.0;
  if (has_r) {
    const int er = pl_align_exp(rr, c.acc.p.emin, c.zero_exp);
    if (er > E) E = er;
  }
  if (anchor) *anchor = E;
  int sh = c.align_bits - E;
  sh = sh < -1000 ? -1000 : (sh > 1000 ? 1000 : sh);
  const double scale = ldexp(1.0, sh);
  double S = 0.0;
  for (int i = 0; i < n; ++i) {
    if (groups > 1 && (i / q) % groups != g) continue;
    double s = 1.0;
    int sha, shb;
    pl_fma_scales(c, sc, i, &s, &sha, &shb);
    const double p = pl_model_value(c, a[i * as]) * pl_model_value(c, b[i * bs]) * s;
    S += trunc(p * scale);
  }
  if (has_r) S += trunc(rr * scale);
  double X = S * ldexp(1.0, -sh);  // == S / scale: the same exact quotient, rounded once
  if (E == PL_GEMM_NO_TERM) X = 0.0;
  return X + 0.0;
}

// Shewchuk's partials of x[0..n) (CPython's math.fsum): p[0..*np) non-overlapping, increasing in
// magnitude, summing exactly to the x (finite, no overflow: the caller's).
PL_HD void pl_partials(const double* x, int n, double* p, int* np_) {
  int m = 0;
  for (int k = 0; k < n; ++k) {
    double v = x[k];
    int i = 0;
    for (int j = 0; j < m; ++j) {
      double y = p[j];
      if (fabs(v) < fabs(y)) {
        const double t = v;
        v = y;
        y = t;
      }
      const double hi = v + y;
      const double lo = y - (hi - v);
      if (lo != 0.0) p[i++] = lo;
      v = hi;
    }
    m = i;
    if (v != 0.0) p[m++] = v;
  }
  *np_ = m;
}

// math.fsum of the partials p[0..n): the exact sum rounded to nearest even (+0 when it is 0)
PL_HD double pl_fsum(const double* p, int n) {
  double hi = 0.0, lo = 0.0;
  if (n > 0) {
    hi = p[--n];
    while (n > 0) {
      const double x = hi, y = p[--n];
      hi = x + y;
      lo = y - (hi - x);
      if (lo != 0.0) break;
    }
    if (n > 0 && ((lo < 0.0 && p[n - 1] < 0.0) || (lo > 0.0 && p[n - 1] > 0.0))) {
      const double y = lo * 2.0, x = hi + y;
      if (y == x - hi) hi = x;
    }
  }
  return hi;
}

// The exact sum of x[0..n) as s = its float64 rounding to nearest even (math.fsum) and t, the top
// partial of the residual (x, -s): s + t rounds like the exact sum (pl_round_sum); p: room for
// n + 1 partials, x: room for n + 1 values (x[n] is overwritten).
PL_HD void pl_exact_sum(double* x, int n, double* p, double* s, double* t) {
  int m;
  pl_partials(x, n, p, &m);
  *s = pl_fsum(p, m);
  x[n] = -*s;
  pl_partials(x, n + 1, p, &m);
  *t = m > 0 ? p[m - 1] : 0.0;
}

// The alignment exponent of a scale s: pl_align_exp, and for inf or NaN max(-1, emin) (numpy's
// frexp gives them exponent 0, as reference._exponents takes them)
PL_HD int pl_scale_exp(double s, int emin) {
  if (!pl_finite(s)) return emin > -1 ? emin : -1;
  return pl_align_exp(s, emin);
}

// The exact sum X of one block FMA with groups (spec 3b, kind::mxf4nvf4; MMA-Sim's GST-FDPA;
// reference._Model._block_fma_grouped): each group of c.group products summed exactly (the
// caller checks the span: reference._check_groups), times its scales sa * sb, aligned at
// e(sa) + e(sb) (e(s) = max(floor(log2 s), scale_emin); zeros: see below) with
// the running value r, truncated to align_bits fraction bits; the scales of group g0 are those
// of its first product (sc, or 1 without scales).
PL_HD_CALL double pl_fma_grouped(const pl_gemm_cfg& c, const double* a, int as, const double* b,
                                 int bs, int n, double r, const pl_gemm_sc* sc) {
  double v[PL_GROUPS_MAX];
  int ev[PL_GROUPS_MAX];
  const double rr = pl_finite(r) ? r : 0.0;
  int E = pl_align_exp(rr, c.acc.p.emin, c.zero_exp);
  int ng = 0;
  for (int g0 = 0; g0 < n && ng < PL_GROUPS_MAX; g0 += c.group, ++ng) {
    const int g1 = g0 + c.group < n ? g0 + c.group : n;
    double val = 0.0;  // (exact)
    bool any = false;  // a non-zero product
    for (int i = g0; i < g1; ++i) {
      const double p = pl_model_value(c, a[i * as]) * pl_model_value(c, b[i * bs]);
      val += p;
      any = any || p != 0.0;
    }
    double sa = 1.0, sb = 1.0;
    if (sc) pl_gemm_scales(c, sc->SA, sc->SB, sc->batch, sc->row, sc->col, sc->k0 + g0, &sa, &sb);
    v[ng] = val * sa * sb;
    const int es = pl_scale_exp(sa, c.scale_emin) + pl_scale_exp(sb, c.scale_emin);
    if (c.zero_exp == PL_GEMM_NO_TERM) {
      ev[ng] = val == 0.0 ? PL_GEMM_NO_TERM : es;  // a zero group takes no part
    } else {  // MMA-Sim's GST-FDPA: products all zero or a zero scale: zero_exp; a group
      // whose products cancel keeps its scales' exponent
      ev[ng] = (!any || sa == 0.0 || sb == 0.0) ? c.zero_exp : es;
    }
    E = ev[ng] > E ? ev[ng] : E;
  }
  int sh = c.align_bits - E;
  sh = sh < -1000 ? -1000 : (sh > 1000 ? 1000 : sh);
  const double scale = ldexp(1.0, sh);
  double S = trunc(rr * scale);
  for (int g = 0; g < ng; ++g) S += trunc(v[g] * scale);
  double X = S * ldexp(1.0, -sh);
  if (E == PL_GEMM_NO_TERM) X = 0.0;
  return X + 0.0;
}

// x cut to a multiple of 2**q, toward zero or down (floor): exact (reference._cut)
PL_HD double pl_cut(double x, int q, bool down) {
  q = q < -1000 ? -1000 : (q > 1000 ? 1000 : q);
  const double v = x * pl_f64_of((pl_u64)(1023 - q) << 52);
  return (down ? floor(v) : trunc(v)) * pl_f64_of((pl_u64)(1023 + q) << 52);
}

// The special values of a block step (reference._specials / _special_step): *sum gets the IEEE
// sum of the non-finite raw products of group g (as pl_fma_sum selects them); true if any.
PL_HD bool pl_block_specials(const pl_gemm_cfg& c, const double* a, int as, const double* b,
                             int bs, int n, int g, int groups, int q, double* sum) {
  bool has = false;
  double acc = 0.0;
  if (!c.has_special) return false;
  for (int i = 0; i < n; ++i) {
    if (groups > 1 && (i / q) % groups != g) continue;
    const double raw = a[i * as] * b[i * bs];
    if (!pl_finite(raw)) {
      acc = has ? acc + raw : raw;
      has = true;
    }
  }
  *sum = acc;
  return has;
}

// The running value after a block step: `nr`, unless the running value r or the step's
// products hold special values: then their IEEE sum.
PL_HD double pl_special_step(double r, double nr, bool has, double sum) {
  if (has) return r + sum;
  return pl_finite(r) ? nr : r;
}

// block_fma: one block of products j0 .. j1-1; a[i * as], b[i * bs] for i = 0 .. j1-j0-1; sc:
// their scales with scales="in_block" (else null). exact_block (AMD CDNA1, reference._Model.
// _exact_block): r = round(r + the block's products), the sum exact (at most PL_EB_MAX).
PL_HD_CALL void pl_gemm_feed_block(const pl_gemm_cfg& c, pl_gemm_elem* e, pl_i64 j0, pl_i64 j1,
                                   const double* a, int as, const double* b, int bs,
                                   const pl_gemm_sc* sc = nullptr) {
  const int n = (int)(j1 - j0);
  const double r = e->acc;
  double sp;
  if (c.sep) {  // addend="separate" (AMD CDNA3: MMA-Sim 2.1.1's TR-FDPA, GTR-FDPA; reference.
    // _Model._separate, spec 3): the products at their own anchor e_p (inner blocks: each at
    // its own, cut at e_p - F); E = max(e_p, e(r)), e(r) >= emin (a zero r too); X cut at
    // E - sum_bits - 1, r at E - F (dropped below E - drop_bits); their sum S cut to sum_bits
    // below its own exponent, then rounded. Products at or beyond 2**(emax + 1) are infinite.
    const int F = c.align_bits, F2 = c.sep - 1, emin = c.acc.p.emin;
    const bool down = c.sep_down != 0;
    int ep = PL_GEMM_NO_TERM;
    double X = 0.0;
    if (!c.inner) {
      X = pl_fma_sum(c, a, as, b, bs, n, 0, 1, 1, false, 0.0, sc, &ep);
    } else {
      const int groups = c.block / c.inner < PL_SEP_GROUPS ? c.block / c.inner : PL_SEP_GROUPS;
      const int q = c.interleave ? c.interleave : c.inner;
      double Xi[PL_SEP_GROUPS];
      int ei[PL_SEP_GROUPS];
      for (int g = 0; g < groups; ++g) {
        Xi[g] = pl_fma_sum(c, a, as, b, bs, n, g, groups, q, false, 0.0, sc, &ei[g]);
        ep = ei[g] > ep ? ei[g] : ep;
      }
      for (int g = 0; g < groups; ++g) X += pl_cut(Xi[g], ep - F, down);
    }
    const double rr = pl_finite(r) ? r : 0.0;
    const int er = pl_align_exp(rr, emin, emin);
    const int E = ep > er ? ep : er;
    double rc = pl_cut(rr, E - F, down);
    if (c.sep_drop && er < E - c.sep_drop) rc = 0.0;
    const double S = pl_cut(X, E - F2 - 1, down) + rc;  // (exact)
    const double total = pl_cut(S, pl_align_exp(S, emin, emin) - F2, down) + 0.0;
    const double nr = pl_rounder_round(c.acc, total, pl_gemm_word(c, c.acc, j0, e->idx));
    bool has = pl_block_specials(c, a, as, b, bs, n, 0, 1, 1, &sp);
    int emax1;
    frexp(pl_fmt_max(c.acc.p.fmt), &emax1);  // (emax + 1)
    const double big = ldexp(1.0, emax1);
    for (int i = 0; i < n; ++i) {  // products that overflow (MMA-Sim: exponent 128 is inf)
      const double p = pl_model_value(c, a[i * as]) * pl_model_value(c, b[i * bs]);
      if (fabs(p) >= big) {
        const double inf = pl_f64_of(p > 0.0 ? 0x7FF0000000000000ULL : 0xFFF0000000000000ULL);
        sp = has ? sp + inf : inf;
        has = true;
      }
    }
    e->acc = pl_special_step(r, nr, has, sp);
    return;
  }
  if (c.order == PL_EXACT_BLOCK) {
    double x[PL_EB_MAX + 2], p[PL_EB_MAX + 2], s, t;
    const int len = n < PL_EB_MAX ? n : PL_EB_MAX;  // (kernel_plan: block <= PL_EB_MAX)
    x[0] = pl_finite(r) ? r : 0.0;
    for (int i = 0; i < len; ++i) {
      x[i + 1] = pl_model_value(c, a[i * as]) * pl_model_value(c, b[i * bs]);  // exact
    }
    pl_exact_sum(x, len + 1, p, &s, &t);
    const double nr = pl_round_sum(c.acc, s, t, 0ULL);  // (deterministic modes only)
    const bool has = pl_block_specials(c, a, as, b, bs, n, 0, 1, 1, &sp);
    e->acc = pl_special_step(r, nr, has, sp);
    return;
  }
  if (c.in_block) {
    const double X = c.group ? pl_fma_grouped(c, a, as, b, bs, n, r, sc)
                             : pl_fma_sum(c, a, as, b, bs, n, 0, 1, 1, true, r, sc);
    const double nr = pl_rounder_round(c.acc, X, pl_gemm_word(c, c.acc, j0, e->idx));
    const bool has = pl_block_specials(c, a, as, b, bs, n, 0, 1, 1, &sp);
    e->acc = pl_special_step(r, nr, has, sp);
    return;
  }
  double t;
  if (!c.inner) {
    const double X = pl_fma_sum(c, a, as, b, bs, n, 0, 1, 1, false, 0.0, sc);
    t = pl_rounder_round(c.blk, X, pl_gemm_word(c, c.blk, j0, e->idx));
    const bool has = pl_block_specials(c, a, as, b, bs, n, 0, 1, 1, &sp);
    t = pl_special_step(0.0, t, has, sp);
  } else {  // a chain of inner block FMAs from 0
    const int groups = c.block / c.inner;
    const int q = c.interleave ? c.interleave : c.inner;
    t = 0.0;
    for (int g = 0; g < groups; ++g) {
      const double X = pl_fma_sum(c, a, as, b, bs, n, g, groups, q, true, t, sc);
      const double nt = pl_rounder_round(c.blk, X, pl_gemm_word(c, c.blk, j0 + g, e->idx));
      const bool has = pl_block_specials(c, a, as, b, bs, n, g, groups, q, &sp);
      t = pl_special_step(t, nt, has, sp);
    }
  }
  const double nr = pl_gemm_add_sp(c, c.acc, r, t, c.K + j0, e->idx);
  // an infinite or NaN r or t (an overflow, special inputs) gives their IEEE sum (spec 5: inf
  // meets -inf is NaN), whether or not other elements' inputs are special (has_special)
  e->acc = (pl_finite(r) && pl_finite(t)) ? nr : r + t;
}

// The value P of segment s promoted into W (W = P without promotion).
PL_HD_CALL void pl_gemm_promote(const pl_gemm_cfg& c, pl_gemm_elem* e, pl_i64 s, double P,
                                double sa, double sb) {
  if (!c.promote) {
    e->W = P;
    return;
  }
  if (c.has_scales) {
    const double sig = pl_rounder_round(c.scale, sa * sb, 0ULL);
    P = P * sig;
  }
  e->W = pl_gemm_add_sp(c, c.prom, e->W, P, 2 * c.K + s, e->idx);
}

// End of segment s = [k0, k1): the segment's value, promoted into W.
PL_HD_CALL void pl_gemm_end_segment(const pl_gemm_cfg& c, pl_gemm_elem* e, pl_i64 s, pl_i64 k0,
                               pl_i64 k1, double sa, double sb) {
  double P = e->acc;
  if (c.order == PL_PAIRWISE) {
    // the odd ones out are carried up until they meet a left sibling
    int lev = e->lev[e->depth - 1];
    pl_i64 q = e->q[e->depth - 1];
    double v = e->val[e->depth - 1];
    --e->depth;
    while (e->depth > 0) {
      if (e->lev[e->depth - 1] == lev + 1 && (q / 2) % 2 == 1) {
        pl_pair_push(c, e, k0, lev + 1, q / 2, v);  // merges with its left sibling
        lev = e->lev[e->depth - 1];
        q = e->q[e->depth - 1];
        v = e->val[e->depth - 1];
        --e->depth;
      } else {
        ++lev;
        q /= 2;
      }
    }
    // round(s0 + T), event K + k0; skipped when s0 is the constant 0 and T a pair sum (a lone
    // product is rounded once, from 0 or from c: never rounded first and then added to c)
    if (e->has_s0 || k1 - k0 == 1) {
      P = pl_gemm_add_sp(c, c.acc, e->has_s0 ? e->s0 : 0.0, v, c.K + k0, e->idx);
    } else {
      P = v;
    }
  }
  pl_gemm_promote(c, e, s, P, sa, sb);
}

// The output value d = round(W, out_format, out_rounding) of element idx (exact double).
PL_HD_CALL double pl_gemm_output(const pl_gemm_cfg& c, double W, pl_u64 idx) {
  return pl_rounder_round(c.out, W, pl_gemm_word(c, c.out, 3 * c.K, idx));
}

// The output value of an element.
PL_HD double pl_gemm_finish(const pl_gemm_cfg& c, pl_gemm_elem* e) {
  return pl_gemm_output(c, e->W, e->idx);
}

// The segment [k0, k1) of segment number s.
PL_HD void pl_gemm_segment(const pl_gemm_cfg& c, pl_i64 s, pl_i64* k0, pl_i64* k1) {
  *k0 = s * c.seg;
  *k1 = *k0 + c.seg < c.K ? *k0 + c.seg : c.K;
}

// ----- spec 3e: lanes and split-K (CPU SIMD libraries; reference._Model._structured) -------------
// Deterministic rounding modes only (the Accumulator checks), so no event numbers: every addition
// is round(x + y, acc, mode) (pl_gemm_add_sp). The products are read at random: product i of the
// segment is a[i * as] * b[i * bs].

// The products of one lane: i0 + j * step for j < cnt, then the tail t0, t0 + 1, ... (n in all).
struct pl_lane_run {
  pl_i64 i0, step, cnt, t0, n;
};

PL_HD pl_i64 pl_lane_at(const pl_lane_run& r, pl_i64 j) {
  return j < r.cnt ? r.i0 + j * r.step : r.t0 + (j - r.cnt);
}

// round(x + y) of two values of the accumulator's grid, and round(s + a * b): with lane_f32
// (fp32 nearest_even, IEEE overflow and zeros, inputs and s exact in float32, no inf/NaN input)
// one float32 addition or fmaf is that rounding.
PL_HD double pl_lane_add(const pl_gemm_cfg& c, double x, double y, pl_u64 idx) {
  if (c.lane_f32) return (double)((float)x + (float)y);
  return pl_gemm_add_sp(c, c.acc, x, y, 0, idx);
}
PL_HD double pl_lane_fma(const pl_gemm_cfg& c, double a, double b, double s, pl_i64 k,
                         pl_u64 idx) {
  if (c.lane_f32) return (double)fmaf((float)a, (float)b, (float)s);
  return pl_gemm_add_sp(c, c.acc, s, pl_gemm_product(c, a, b, k, idx), k, idx);
}

// Pairwise combination by a stack (level-by-level pairs, an odd one carried: the binary-counter
// merges, then the stack folded from the right).
struct pl_pw_stack {
  int depth;
  int lev[PL_PAIR_STACK];
  double val[PL_PAIR_STACK];
};

PL_HD_CALL void pl_pw_push(const pl_gemm_cfg& c, pl_pw_stack* st, double v, pl_u64 idx) {
  int lev = 0;
  while (st->depth > 0 && st->lev[st->depth - 1] == lev) {
    --st->depth;
    v = pl_lane_add(c, st->val[st->depth], v, idx);
    ++lev;
  }
  st->lev[st->depth] = lev;
  st->val[st->depth] = v;
  ++st->depth;
}

PL_HD_CALL double pl_pw_end(const pl_gemm_cfg& c, pl_pw_stack* st, pl_u64 idx) {
  double v = st->val[--st->depth];
  while (st->depth > 0) {
    --st->depth;
    v = pl_lane_add(c, st->val[st->depth], v, idx);
  }
  return v;
}

// The products of run r reduced by the order from 0 (reference._Model._ordered with s0 None):
// sequential, blocked (blocks of the run's own positions), pairwise (a lone product: 0 + p).
PL_HD_CALL double pl_run_reduce(const pl_gemm_cfg& c, const double* a, pl_i64 as, const double* b,
                                pl_i64 bs, const pl_lane_run& r, pl_u64 idx) {
  if (c.order == PL_SEQUENTIAL) {
    double s = 0.0;
    for (pl_i64 j = 0; j < r.n; ++j) {
      const pl_i64 k = pl_lane_at(r, j);
      if (c.fma64) {
        s = pl_rounder_round(c.acc, fma(a[k * as], b[k * bs], s), 0ULL);
      } else {
        s = pl_lane_fma(c, a[k * as], b[k * bs], s, k, idx);
      }
    }
    return s;
  }
  if (c.order == PL_BLOCKED) {
    double total = 0.0;
    for (pl_i64 j0 = 0; j0 < r.n; j0 += c.block) {
      const pl_i64 j1 = j0 + c.block < r.n ? j0 + c.block : r.n;
      double bsum = 0.0;
      for (pl_i64 j = j0; j < j1; ++j) {
        const pl_i64 k = pl_lane_at(r, j);
        bsum = pl_lane_fma(c, a[k * as], b[k * bs], bsum, k, idx);
      }
      total = pl_lane_add(c, total, bsum, idx);
    }
    return total;
  }
  // pairwise
  if (r.n == 1) {
    const pl_i64 k = pl_lane_at(r, 0);
    return pl_gemm_add_sp(c, c.acc, 0.0, pl_gemm_product(c, a[k * as], b[k * bs], k, idx), k, idx);
  }
  pl_pw_stack st;
  st.depth = 0;
  for (pl_i64 j = 0; j < r.n; ++j) {
    const pl_i64 k = pl_lane_at(r, j);
    pl_pw_push(c, &st, pl_gemm_product(c, a[k * as], b[k * bs], k, idx), idx);
  }
  return pl_pw_end(c, &st, idx);
}

// The lane tree (postfix tokens of c.tree) over the lane values v[0 .. nv): lanes >= nv take
// no part (the tree pruned), a node's present children added left to right; the token
// PL_TREE_TAIL is v[PL_TREE_TAIL], present where tail is (lane_tail="separate_first").
PL_HD_CALL double pl_lane_tree(const pl_gemm_cfg& c, const double* v, int nv, bool tail,
                               pl_u64 idx) {
  double st[PL_TREE_MAX];
  bool has[PL_TREE_MAX];
  int sp = 0;
  for (int i = 0; i < c.tree_len; ++i) {
    const int tok = c.tree[i];
    if (tok >= 0) {
      has[sp] = tok == PL_TREE_TAIL ? tail : tok < nv;
      st[sp] = has[sp] ? v[tok] : 0.0;
      ++sp;
      continue;
    }
    const int base = sp + tok;  // (tok = -m: m children)
    bool h = false;
    double x = 0.0;
    for (int j = base; j < sp; ++j) {
      if (!has[j]) continue;
      x = h ? pl_lane_add(c, x, st[j], idx) : st[j];
      h = true;
    }
    sp = base;
    st[sp] = x;
    has[sp] = h;
    ++sp;
  }
  return st[0];
}

// The value of the segment's products r0 .. r1-1 from 0 (reference._Model._lanes): the lanes,
// their tree, the tail.
PL_HD_CALL double pl_lanes_value(const pl_gemm_cfg& c, const double* a, pl_i64 as, const double* b,
                                 pl_i64 bs, pl_i64 r0, pl_i64 r1, pl_u64 idx) {
  const pl_i64 n = r1 - r0;
  if (n <= 0) return 0.0;
  if (!c.lanes || (c.small_k && n < c.small_k)) {
    const pl_lane_run run{r0, 1, n, r1, n};
    return pl_run_reduce(c, a, as, b, bs, run, idx);
  }
  const pl_i64 L = c.lanes;
  const pl_i64 U = c.lane_unroll ? c.lane_unroll : L;
  const pl_i64 full = c.lane_tail == PL_TAIL_LANES ? n : n - n % U;
  const pl_i64 V = c.lane_vector;  // the cleanup loop: products full .. full2 - 1 in lanes < V
  const pl_i64 full2 = V ? n - n % V : full;
  const pl_lane_run tail{r0 + full2, 1, n - full2, r1, n - full2};
  double v[PL_LANES_MAX + 1];
  int nv = (int)(L < full ? L : full);
  if (V && nv < (V < full2 - full ? V : full2 - full)) nv = (int)(V < full2 - full ? V : full2 - full);
  for (int lane = 0; lane < nv; ++lane) {
    const pl_i64 cnt = lane < full ? (full - lane + L - 1) / L : 0;
    const bool first = lane == 0 && c.lane_tail == PL_TAIL_FIRST;
    if (V) {  // the lane's own products by the order, then the cleanup loop's one by one
      const pl_lane_run run{r0 + lane, L, cnt, r1, cnt};
      double s = cnt ? pl_run_reduce(c, a, as, b, bs, run, idx) : 0.0;
      for (pl_i64 k = r0 + full + lane; lane < V && k < r0 + full2; k += V) {
        s = pl_lane_fma(c, a[k * as], b[k * bs], s, k, idx);
      }
      v[lane] = s;
      continue;
    }
    const pl_lane_run run{r0 + lane, L, cnt, r0 + full, first ? cnt + (n - full) : cnt};
    v[lane] = pl_run_reduce(c, a, as, b, bs, run, idx);
  }
  if (nv == 0 && c.lane_tail == PL_TAIL_FIRST) {  // (no main loop: the tail is lane 0)
    v[0] = pl_run_reduce(c, a, as, b, bs, tail, idx);
    nv = 1;
  }
  const bool into = full < n && c.lane_tail == PL_TAIL_SEPARATE_FIRST;
  if (into) v[PL_TREE_TAIL] = pl_run_reduce(c, a, as, b, bs, tail, idx);
  bool has = nv > 0 || into;
  double t = has ? pl_lane_tree(c, v, nv, into, idx) : 0.0;
  if (full < n && c.lane_tail == PL_TAIL_SEPARATE) {
    const double x = pl_run_reduce(c, a, as, b, bs, tail, idx);
    t = has ? pl_lane_add(c, t, x, idx) : x;
  } else if (c.lane_tail == PL_TAIL_AFTER) {
    for (pl_i64 k = r0 + full2; k < r1; ++k) {
      t = pl_lane_fma(c, a[k * as], b[k * bs], has ? t : 0.0, k, idx);
      has = true;
    }
  }
  return t;
}

// Spec 3e's halving cut of a range of n products (accumulator.halving_cut).
PL_HD pl_i64 pl_halving_cut(pl_i64 n, int lanes) {
  const pl_i64 h = n / 2;
  return h - h % (lanes ? lanes : 1);
}

// The value of a segment of n products with lanes and split-K (reference._Model._structured);
// has_s0: the starting value s0 (c without promotion) takes part.
PL_HD_CALL double pl_gemm_structured(const pl_gemm_cfg& c, const double* a, pl_i64 as,
                                     const double* b, pl_i64 bs, pl_i64 n, bool has_s0, double s0,
                                     pl_u64 idx) {
  const pl_i64 S = c.split_k;
  double T;
  if (!S) {
    T = pl_lanes_value(c, a, as, b, bs, 0, n, idx);
  } else if (c.split_combine == PL_SPLIT_SEQUENTIAL) {  // (accumulator.split_chunks)
    double t = 0.0;
    bool ht = false;
    pl_i64 j0 = 0;
    pl_i64 S1 = S;  // split_equal: ceil(n / S) equal chunks where their length fits
    if (c.split_equal && n > 0) {
      const pl_i64 m = (n + S - 1) / S;
      if (n % m == 0 && (n / m) % c.split_equal == 0) S1 = n / m;
    }
    while (j0 < n) {
      const pl_i64 left = n - j0;
      pl_i64 step = left < S1 ? left : S1;
      if (c.split_balance && left < 2 * S && left > S) {
        const pl_i64 u = c.split_balance;
        const pl_i64 h = c.split_half ? left / 2 : (left + 1) / 2;
        step = ((h + u - 1) / u) * u;
        step = step < left ? step : left;
      }
      const double v = pl_lanes_value(c, a, as, b, bs, j0, j0 + step, idx);
      if (!ht) {
        t = has_s0 ? pl_gemm_add_sp(c, c.acc, s0, v, 0, idx) : v;
        ht = true;
      } else {
        t = pl_lane_add(c, t, v, idx);
      }
      j0 += step;
    }
    return t;
  } else if (c.split_combine == PL_SPLIT_PAIRWISE) {
    pl_pw_stack st;
    st.depth = 0;
    for (pl_i64 j0 = 0; j0 < n; j0 += S) {
      pl_pw_push(c, &st, pl_lanes_value(c, a, as, b, bs, j0, j0 + S < n ? j0 + S : n, idx), idx);
    }
    T = pl_pw_end(c, &st, idx);
  } else {  // halving (numpy's pairwise_sum), by an explicit stack of ranges
    pl_i64 lo[PL_PAIR_STACK], hi[PL_PAIR_STACK];
    int stage[PL_PAIR_STACK];
    double left[PL_PAIR_STACK];
    int d = 0;
    lo[0] = 0;
    hi[0] = n;
    stage[0] = 0;
    double ret = 0.0;
    for (;;) {
      const pl_i64 m = hi[d] - lo[d], h = pl_halving_cut(m, c.lanes);
      if (stage[d] == 0 && (m <= S || h < 1)) {
        ret = pl_lanes_value(c, a, as, b, bs, lo[d], hi[d], idx);
      } else if (stage[d] == 0) {  // the first half
        stage[d] = 1;
        lo[d + 1] = lo[d];
        hi[d + 1] = lo[d] + h;
        stage[d + 1] = 0;
        ++d;
        continue;
      } else if (stage[d] == 1) {  // the second half
        left[d] = ret;
        stage[d] = 2;
        lo[d + 1] = lo[d] + h;
        hi[d + 1] = hi[d];
        stage[d + 1] = 0;
        ++d;
        continue;
      } else {
        ret = pl_lane_add(c, left[d], ret, idx);
      }
      if (d == 0) break;
      --d;  // (ret goes to the parent)
    }
    T = ret;
  }
  return has_s0 ? pl_gemm_add_sp(c, c.acc, s0, T, 0, idx) : T;
}

// Spec 3f (k1_product): with K = 1, no promotion and c = +0, a finite product p_0 is the result
// round(p_0, acc) itself, not 0 + p_0 (a -0 product stays -0). Call after the segment.
PL_HD_CALL void pl_gemm_k1(const pl_gemm_cfg& c, pl_gemm_elem* e, double cval, double a,
                           double b) {
  if (!c.k1 || c.K != 1 || c.promote) return;
  const double p = pl_gemm_product(c, a, b, 0, e->idx);
  if (cval == 0.0 && !pl_signbit(cval) && pl_finite(p)) e->W = pl_rounder_round(c.acc, p, 0ULL);
}

// Whether spec 3e's structure is on (the kernels then call pl_gemm_structured per segment).
PL_HD bool pl_gemm_is_structured(const pl_gemm_cfg& c) { return c.lanes || c.split_k; }


#endif  // PL_GEMM_CUH
