"""The inner-product model: :class:`Accumulator`, and the exact arithmetic every backend mirrors.

An :class:`Accumulator` says how ``d = c + sum_k a_k * b_k`` is evaluated for each output element
of a GEMM: how products are formed, in which order they are added, in which format and rounding
mode each partial sum is kept, when partial sums are promoted to a wider accumulator, and how a
block-FMA (tensor-core) unit aligns and truncates its terms. :func:`precision_lab.gemm` evaluates
the model on the CPU (numpy) and on the GPU (CuPy kernels); both follow the specification below
bit for bit, so it is written down here once, and it is stable.

>>> import precision_lab as pl
>>> acc = pl.Accumulator("bf16")
>>> acc.format.name, acc.rounding, acc.order
('bf16', 'nearest_even', 'sequential')
>>> import dataclasses
>>> dataclasses.replace(acc, promote_every=128).promote_every
128

Specification of the arithmetic
===============================

Notation. ``round(x, F, mode)`` is :func:`precision_lab.round_to` of the *exact* real ``x`` onto
format ``F`` with the accumulator's ``overflow`` and ``subnormals`` switches: every rounding below
rounds an exact intermediate exactly once. ``acc`` is :attr:`Accumulator.format`, ``mode`` is
:attr:`Accumulator.rounding`. ``K`` is the reduction length, ``k`` a global index ``0 <= k < K``.

1. Inputs. ``a`` and ``b`` are first put on the grid of the input format(s) by :func:`gemm`.
   The accumulator input ``c`` is rounded (nearest_even) to ``out_format``, the type C and D share
   on a GPU; with :attr:`c_format` (C and D of different types: Volta's and Turing's
   ``mma.m8n8k4.f32.f16.f16.f16``; ``order="block_fma"``, ``addend="in_block"``, no promotion)
   it is rounded to ``c_format`` instead, and in the first block FMA its alignment exponent is
   ``max(floor(log2|c|), c_format.emin)`` (MMA-Sim 2.1.1: a subnormal fp16 C aligns at fp16's
   -14, not at its own exponent). Numpy reference only (the native backend hands it to numpy,
   the CuPy backend raises). Products ``p_k = a_k * b_k`` are exact (the float64 product is
   exact because input formats have at most 26 significant bits); with :attr:`product_format`
   set they are ``round(a_k * b_k, product_format, product_rounding)`` instead (separate
   multiply and add).

2. Segments (promotion). With ``promote_every = N`` the index range is cut into segments
   ``[sN, (s+1)N)``. Each segment is reduced by the order below starting from ``0`` (no ``c``),
   giving a partial sum ``P_s`` in ``acc``. The wide accumulator ``W`` (``promote_format``,
   ``promote_rounding``) starts at ``c`` and takes ``W = round(W + P_s * sigma_s, promote_format,
   promote_rounding)`` (one rounding: a fused multiply-add), ``sigma_s`` the scale of the segment
   (1 without scales). Without promotion (and without scales) there is one segment, reduced
   starting from ``c``, and ``W`` is that result. Scales on A and B: see
   :func:`precision_lab.gemm.reference.gemm`; scales along K force a segment boundary at every
   scale block (``promote_every`` defaults to the scale block and must divide it), and
   ``sigma_s = round(sa * sb, promote_format, nearest_even)``. Per-tensor and per-row/column
   scales make one segment whose partial sum is scaled the same way (as ``torch._scaled_mm``).

3. Orders (within a segment, starting value ``s0`` = ``c`` or ``0``):

   ``sequential``: ``s = s0``; for each k in increasing order ``s = round(s + p_k, acc, mode)``.
   With inputs wider than 26 bits (fp64: FP64 DMMA, AMD f64 MFMA; fp64 nearest_even only) the
   products are not exact in float64: each step is the fused multiply-add ``s = fma(a_k, b_k,
   s)`` (IEEE fusedMultiplyAdd, its special values included), on every backend.

   ``pairwise``: level by level: adjacent partial sums are paired, ``(x0+x1), (x2+x3), ...``,
   each pair sum rounded; an odd one out is carried unchanged to the next level; until one value
   ``T`` remains; then ``round(s0 + T, acc, mode)`` (skipped when ``s0`` is the constant 0
   and ``T`` is a pair sum, already on the grid; a lone product is rounded).

   ``blocked``: consecutive blocks of ``block`` products are each summed sequentially from 0
   (the first step is ``round(0 + p)``); the running total starts at ``s0`` and takes
   ``t = round(t + B_j, acc, mode)`` for each block sum ``B_j`` in order.

   ``block_fma`` (tensor cores): consecutive blocks of ``n = block`` products. For a block and
   the running value ``r`` (``r = s0`` before the first block):

   * exponents: ``e(a) = max(floor(log2|a|), emin_A)`` for a non-zero input (subnormal inputs
     take the format's ``emin``; significands then lie in [0, 2)); a product's alignment
     exponent is ``e(a_k) + e(b_k)`` (its significand lies in [0, 4)); the running value's is
     ``max(floor(log2|r|), acc.emin)``. Zero products and a zero ``r`` take no part, unless
     :attr:`zeros_in_anchor` is set: then a zero product (a factor zero, whatever the other)
     and a zero ``r`` (or ``t`` below) take the fixed alignment exponent
     :attr:`zero_exponent` and take part in the anchor like any other term. Evidence: MMA-Sim
     2.1.1 (Xie et al., arXiv 2511.10909; ``t_fdpa``: ``e[s == 0.0] = e_zero``, a constant
     per architecture and output type: fp32 output -131 on Volta, -132 on Turing, Ampere and
     Ada, -133 on Hopper and both Blackwells; fp16 output -19, -20, -21; block-scaled
     ``kind::mxf8f6f4`` -133, ``kind::mxf4nvf4`` -139). As ``zero_exponent`` lies below
     ``acc.emin`` in every preset, a zero product moves the anchor only where no running value
     takes part in the block (``addend="after_block"`` without inner blocks, ``"separate"``).
     The rule it replaces (a zero operand at -126, so a zero product at ``e(partner) - 126``,
     MMA-Sim's earlier snapshot) differs from MMA-Sim 2.1.1 beside huge operands, e.g. Hopper
     bf16 ``a = [2**-20 * (1 + 2**-7) + 2**-27, 0]``, ``b = [1 + 2**-7, 2**127]``, ``c = 0``:
     MMA-Sim (and this rule) keep the product's low bits, the old rule's anchor 1 cut them.
   * anchor ``E`` = the largest alignment exponent among the block's products and (with
     ``addend="in_block"``) ``r`` that take part.
   * each term ``x`` (product, and ``r`` when in block) becomes ``sign(x) * floor(|x| /
     2**(E - align_bits)) * 2**(E - align_bits)``: bits of weight below ``2**(E - align_bits)``
     are truncated (toward zero, on the magnitude).
   * the truncated terms are summed exactly (the sum is an integer multiple of
     ``2**(E - align_bits)`` below ``2**53`` of them) giving ``X``; the block is empty-valued
     (``X = 0``, sign +) when no term takes part.
   * ``addend="in_block"``: ``r = round(X, acc, mode)``.
     ``addend="after_block"``: ``r = round(r + round(X, acc, block_rounding), acc, mode)``.
   * inner blocks (``inner_block = m``, only with ``addend="after_block"``; ``m`` divides
     ``n``): the block's value is not ``round(X, acc, block_rounding)`` but the result ``t`` of
     a chain of ``n / m`` inner block FMAs, each the rule above with ``addend="in_block"``
     applied to ``m`` products: ``t = 0``; for inner block ``i = 0, 1, ..., n/m - 1`` in
     order: anchor ``E`` = the largest alignment exponent of the inner block's non-zero
     products and of ``t`` (``t``'s as ``r``'s above); every term (products and ``t``)
     truncated to a multiple of ``2**(E - align_bits)``; ``t = round(X_i, acc,
     block_rounding)`` of their exact sum ``X_i`` (an inner block without a term leaves
     ``t`` unchanged). Then ``r = round(r + t, acc, mode)``. Which products an inner block
     takes: with ``q = inner_interleave`` (default ``m``: contiguous runs), the product with
     index ``k`` in the block starting at ``j0`` (``l = k - j0``, ``0 <= l < n``) belongs to
     inner block ``(l // q) % (n / m)``. ``q`` divides ``m``. (FP8 ``mma.sync`` on Hopper and
     Blackwell, emulated on fp16 tensor cores: ``n = 32``, ``m = 16``, ``q = 2``: the
     products with ``l % 4`` in {0, 1} first, then those with ``l % 4`` in {2, 3}.) A last,
     shorter block (``K`` not a multiple of ``n``) uses the same rule with its ``l``.

   ``block_fma`` with ``addend="separate"`` (AMD CDNA3 MFMA, MMA-Sim 2.1.1's TR-FDPA and
   GTR-FDPA; ``F = align_bits``, ``F2 = sum_bits``, every cut below by ``align_rounding``:
   ``toward_zero`` truncates, ``down`` floors toward -inf):

   * a product whose magnitude reaches ``2**(acc.emax + 1)`` (fp32: ``2**128``) is ±inf
     before the sum (a special value of the step: spec section 5; ``inf - inf`` is NaN);
   * the block's products are aligned to their own anchor ``e_p`` (the largest alignment
     exponent of the block's non-zero products; ``r`` takes no part) and truncated toward zero
     to ``F`` fraction bits, giving ``X``; with inner blocks (``inner_block = m``, dealt by
     ``inner_interleave`` as above) each inner block gives ``X_i`` at its own anchor ``e_i``,
     and ``X`` is the sum of the ``X_i`` each cut to a multiple of ``2**(e_p - F)``, ``e_p =
     max e_i``;
   * ``e(r) = max(floor(log2|r|), acc.emin)``, and ``acc.emin`` for a zero ``r``: the running
     value always takes part; ``E = max(e_p, e(r))`` (``e(r)`` alone without products);
   * ``X' = cut(X, E - F2 - 1)`` and ``r' = cut(r, E - F)``; with :attr:`drop_bits` ``= D``,
     ``r' = 0`` when ``e(r) < E - D`` (GTR-FDPA: ``D = F + 1``);
   * ``S = X' + r'`` (exact) is normalised and cut to ``F2`` fraction bits below its own
     exponent: ``S' = cut(S, max(floor(log2|S|), acc.emin) - F2)``;
   * ``r = round(S', acc, mode)`` (an exact zero: +0).

   Every backend (CuPy: at most 16 inner blocks).

   ``exact_block`` (AMD CDNA1 fp16/bf16 MFMA, MMA-Sim's E-FDPA): consecutive blocks of
   ``block`` products; ``r = round(r + sum of the block's products, acc, mode)`` with the sum
   exact (one rounding per block). Deterministic modes only; every backend (CuPy: blocks of
   at most 32).

   ``compensated`` (Kahan summation, every operation in ``acc``): ``s = s0``, ``c = 0``; for
   each k: ``y = round(p_k - c)``, ``t = round(s + y)``, ``c = round(round(t - s) - y)``,
   ``s = t``; the segment's value is ``s``. The compensation ``c`` feeds the next term, so a
   long sum of small terms does not stagnate. Numpy reference only: the CuPy backend raises
   NotImplementedError.

   ``blas``: fp32 only: ``P = float32 matmul`` (numpy/BLAS, its own order and FMA use) of the
   inputs held in float32, plus ``s0`` added in float32. Not bit-reproducible across BLAS builds;
   for speed (training emulation), not for bit-exact studies.

3b. Scales inside the block FMA (``scales="in_block"``, block-scaled MMA: tcgen05
   ``kind::mxf8f6f4`` / ``kind::mxf4nvf4``, sm_120 ``mma.block_scale``; MMA-Sim's ST-FDPA and
   GST-FDPA). No promotion (``promote_every`` must be None): the scale blocks of
   :func:`~precision_lab.gemm_blocks` enter the ``block_fma`` terms. Without ``group`` each
   product ``a_k * b_k`` becomes ``a_k * b_k * sa * sb`` (``sa``, ``sb`` the scales of
   ``k``'s block, powers of two) with alignment exponent ``e(a_k) + e(b_k) + log2(sa * sb)``;
   a zero product (``zeros_in_anchor``) takes :attr:`zero_exponent`, unscaled (MMA-Sim's
   ST-FDPA).
   With ``group = G`` (dividing ``block`` and the scale block) the terms are groups of ``G``
   consecutive products: ``(sum of the group's products, exact) * sa * sb`` with alignment
   exponent ``e(sa) + e(sb)``, ``e(s) = max(floor(log2 s), emin)`` of ``scale_format`` (the
   group's own magnitude does not move the anchor). Without ``zeros_in_anchor`` a group whose
   sum is zero takes no part; with it (MMA-Sim's GST-FDPA) a group whose products are all zero,
   or whose scale is zero, takes :attr:`zero_exponent`, and a group whose non-zero products
   cancel keeps its scales' exponent. The running
   value ``r`` is aligned with them (``addend="in_block"``). Every backend computes the model:
   the CuPy and native per-element kernels in ``pl_gemm.cuh`` (at most 16 groups per block),
   the native block-FMA fast path without groups and a native float64 kernel with them.
   Without ``group``, the scaled products may also enter ``addend="separate"``'s block FMAs
   (spec 2's AMD rule with the scaled terms: AMD CDNA4's ``v_mfma_scale_*_f8f6f4`` model,
   inferred), on every backend too (the header's ``pl_fma_sum`` takes the scales in both).

3c. Input subnormals (``input_subnormals="flush"``, AMD CDNA2 fp16/bf16): a, b (in their
   input formats) and c (in ``out_format``) that are subnormal become ``+0`` before anything
   else (every backend: the flush, then the model with ``input_subnormals="keep"``).
   ``input_subnormals="flush_signed"`` (x86 DAZ, Arm FPCR.FIZ): they become a zero of their
   own sign (``-0`` for a negative subnormal), which decides the sign of a zero product and of
   a zero sum. ``"flush_signed_c"``: only ``c`` is (x86 AMX-FP16: DAZ on the fp32 operands,
   while fp16 subnormal inputs convert exactly to normal fp32 numbers).
   ``"flush_signed_fp16"``: a and b pass through fp16 under DAZ, so an input below fp16's
   smallest normal (``2**-14``) becomes a zero of its sign, and ``c`` is flushed as by
   ``"flush_signed"`` (x86 AMX-FP8, Bochs: E5M2 subnormals are fp16 subnormals and flush, E4M3
   subnormals are fp16 normals and stay). Numpy reference only (:func:`reference_only`).

3d. CPU dot-product instructions (numpy reference only, :func:`reference_only`).
   :attr:`pair_order` ``"odd_first"``: the products are taken in pairs ``(2i, 2i + 1)`` and
   each pair in the order ``2i + 1``, ``2i`` (x86 VDPBF16PS: the odd BF16 element's product
   is added first); the model then runs on the products in that order, every order and event
   number above referring to the new position (an odd last product stays last; software that
   pads K with a zero element adds a zero product first, which can change only the sign of a
   zero accumulator).
   :attr:`tininess` ``"after_rounding"`` (with ``subnormals="flush"``): a result is flushed to
   a zero of its sign when the exact value, rounded to the format's precision with an
   unbounded exponent, lies below the smallest normal (IEEE 754's tininess after rounding,
   x86 MXCSR.FTZ); the default ``"subnormal_grid"`` flushes a result whose rounding onto the
   format's subnormal grid is subnormal, so an exact value just below the smallest normal
   that rounds up to it is kept there and flushed here (fp32: ``2**-126 - 2**-150``, which
   rounds to ``2**-126`` on the subnormal grid and to ``2**-126 - 2**-150`` with an unbounded
   exponent). Deterministic modes only.

3e. Lanes and split-K (CPU SIMD libraries: OpenBLAS, oneDNN, numpy's reductions). With
   :attr:`lanes` ``= L`` or :attr:`split_k` ``= S`` (orders ``sequential``, ``pairwise`` and
   ``blocked``; deterministic rounding modes; every value below is in ``acc`` and every
   addition ``x + y`` is ``round(x + y, acc, mode)``), a segment of ``n`` products (relative
   index ``i``, starting value ``s0``) is reduced as follows.

   * Split (``split_k = S``): ``split_combine="sequential"``: the chunks ``[jS, (j+1)S)`` are
     each reduced by the lane rule below to ``V_j``, and ``t = s0`` (or ``V_0`` without
     ``s0``) takes ``t = t + V_j`` in order (a BLAS K-blocking loop that adds each K-block
     into C). With :attr:`split_balance` ``= u`` the chunks are OpenBLAS's level-3 driver's:
     of the ``r`` products left, a chunk takes ``S`` when ``r >= 2S``, ``ceil(h / u) * u``
     when ``S < r < 2S``, else ``r``, where ``h`` is half of ``r``: ``ceil(r / 2)`` with
     :attr:`split_half` ``"ceil"`` (OpenBLAS's threaded driver ``level3_thread.c``; measured:
     numpy 2.4.6's OpenBLAS, float32 64x64 on an Intel Xeon, ``K = 1337`` gives blocks of
     448, 445, 444: ``u = 1``), ``floor(r / 2)`` with ``"floor"`` (its single-thread driver
     ``level3.c``, ``u = GEMM_UNROLL_M``; measured: the same numpy, float32 8x8 on an AMD
     Zen 3, ``K = 641`` gives 320, 160, 161, ``K = 1201`` 320, 320, 280, 281: ``u = 8``;
     float64 ``K = 600``: 256, 172, 172, ``u = 4``) (:func:`split_chunks`). With
     :attr:`split_equal` ``= e`` the segment is cut into ``m = ceil(n / S)`` equal chunks of
     ``n / m`` where that is a whole multiple of ``e``, else into chunks of ``S`` (oneDNN's
     AMX BF16 brgemm, measured through torch 2.13 on an Intel Xeon with AMX-BF16: ``S = 32``,
     ``e = 2``; K = 66 gives three tiles of 22, K = 68 gives 32, 32, 4).
     ``"pairwise"``: the chunk values are combined by the pairwise tree below, then
     ``s0 + T``. ``"halving"``: a range of ``n > S`` products is cut at ``h = n // 2 - (n // 2)
     % L`` (``L = 1`` without lanes) into ``[0, h)`` and ``[h, n)``, each reduced the same
     way, and the two values added; a range of at most ``S`` is reduced by the lane rule
     (numpy's ``pairwise_sum``: ``S = 128``, ``L = 8``); then ``s0 + T``.
   * Lanes (``lanes = L``) of a range of ``n`` products, ``n >= small_k`` (default: always):
     with ``lane_tail="lanes"`` product ``i`` goes to lane ``i mod L`` (with :attr:`lane_run`
     ``= R``, ``order="sequential"``, numpy reference only: run ``r``, the products ``rR ..
     min(rR + R, n) - 1``, goes to lane ``r mod L``; each run is summed left to right from its
     first product, then added to its lane: x86 AMX-FP8's TDP*8PS, ``R = 2``, whose lanes add
     pair sums ``p0 + p1``, ``p2 + p3``, published in Bochs's ``amx.cc``). Otherwise the main
     loop takes the first ``f = n - n mod U`` products (``U`` = :attr:`lane_unroll`, default
     ``L``; a multiple of ``L``), product ``i < f`` in lane ``i mod L``, and the tail ``i >=
     f``: ``"after"``: added one by one, in order, to the combined value (numpy's
     ``pairwise_sum``: ``res += a[i]``); ``"first"``: added one by one to lane 0 after its own
     products, before the lanes are combined (torch's CPU bf16 GEMM); ``"separate"``: summed
     in order in an accumulator of its own from 0, whose value is added to the combined value
     (OpenBLAS ``sdot``: ``U = 32``; with :attr:`tail_format` ``T`` that sum is in ``T``
     from ``+0``, its products rounded to :attr:`tail_product_format` where given, the
     lanes' value is added to it in ``T`` and the result rounded to ``acc``: numpy 2.4.6's
     ``np.dot`` of float32 vectors, OpenBLAS 0.3.31's Haswell ``sdot`` measured on an AMD
     Zen 3: 32 fp32 FMA lanes, the ``K mod 32`` tail in a C ``double`` of float products;
     the numpy reference only); ``"separate_first"``: summed the same way, and its value
     added to the largest subtree of the lane tree that holds lane 0 and only lanes ``= 0 mod
     V`` (``V`` = :attr:`lane_vector`; lane 0 alone without it), before that subtree takes
     part in any other addition (:func:`join_tail`; torch 2.13's ``torch.sum`` of float32,
     measured on an Intel Xeon: the four 8-wide vector accumulators are added lane by lane,
     the scalar tail's sum joins lane 0 of that vector, then the 8 lanes are added in turn).
     With :attr:`lane_vector` ``= V`` a cleanup loop comes between the main loop and the tail:
     products ``f .. f2 - 1`` (``f2 = n - n mod
     V``) go to lane ``i mod V``, continuing those lanes, and the tail is ``f2 .. n - 1``
     (torch.sum: the whole vectors left after its 4-accumulator loop go to the first one).
     Each non-empty lane is reduced by :attr:`order` starting from 0 (one accumulator per SIMD
     lane; exact products: an FMA per lane, ``product_format``: a separate multiply and add).
     The lane values are combined by :attr:`lane_combine`: ``"sequential"`` ``((l0 + l1) +
     l2) + ...``, ``"pairwise"``
     (adjacent pairs level by level, an odd one carried: ``(l0 + l1) + (l2 + l3)``),
     ``"halving"`` (SIMD horizontal reduction: with ``h = ceil(m / 2)`` of the ``m`` values
     left, ``x_i = x_i + x_{i+h}`` for ``i < m - h``, until one is left) or an explicit tree:
     nested tuples of the lane numbers ``0 .. L-1``, each exactly once, a tuple's children
     added left to right. Empty lanes (``n < L``) take no part (the tree is pruned). A range
     of ``n < small_k`` products, or without lanes, is reduced by :attr:`order` from 0.
   * Without split, the segment's value is ``s0 + V`` (``V`` without ``s0``).
   * ``s0`` is the rounded ``c``, or ``+0`` without ``c`` (spec 1), and is always added: a
     sum whose every product underflows to ``-0`` gives ``+0`` here. Libraries differ there
     (measured with all products ``-1e-60``: numpy 2.4.6 float32 64x64 gives ``-0`` at K = 40
     and ``+0`` at K = 1000, torch 2.13 bf16 gives ``-0``); the probe's special inputs do not
     hold that case.

   Every backend: the per-element kernels of ``pl_gemm.cuh`` (``pl_gemm_structured``; at most
   64 lanes, any lane tree: the named ones and explicit trees are handed to the kernels as
   postfix tokens), the native backend's fast kernels stepping aside.

3f. A single product (:attr:`k1_product`, any order): with ``K = 1`` and a ``+0`` (or no)
   ``c``, the result is ``round(p_0, acc, mode)``, the product itself, not ``0 + p_0`` (a
   ``-0`` product stays ``-0``): libraries that take ``K = 1`` as an outer product (measured:
   torch 2.13 CPU float32 matmul). Every backend (``pl_gemm_k1``) with a deterministic
   ``rounding``; with a stochastic one, the numpy reference only.

3g. Kernels chosen by K (:attr:`switch_k`, :attr:`long_kernel`): a GEMM of ``K > switch_k``
   products is the model ``long_kernel`` (every rule above is that model's, and it may switch
   again), a GEMM of ``K <= switch_k`` this one: libraries pick their kernel by the shape
   (measured: torch 2.13's float16 matmul, 8x8 output, on an Intel Xeon with AVX512-FP16:
   4 interleaved fp32 lanes up to K = 64, from K = 65 one fp32 FMA chain over the first ``K -
   K mod 512`` products with the rest summed apart and added). :func:`~precision_lab.gemm`
   picks the model before it picks a backend, so every backend serves both.

4. Output: ``d = round(W, out_format, out_rounding)``. Signs of zero (:attr:`zero_sign`):

   * ``"ieee"`` (default): IEEE 754-2019 section 6.3 for every addition: an exact zero sum
     is ``+0`` (``-0`` when both addends are ``-0``), and ``-0`` under ``down`` unless both
     addends are ``+0``; a non-zero value that rounds to zero (underflow, or a flush) keeps
     its sign. A block FMA's exact sum ``X`` that is zero is ``+0`` (its terms are summed as
     one fixed-point number, which has no signed zero); a non-zero ``X`` that rounds to zero
     keeps its sign.
   * ``"positive"``: every rounding of the model (accumulation steps, promotion, the output)
     gives ``+0`` for a zero result: a fixed-point datapath has no ``-0``. This is what the
     hardware model of NVIDIA tensor cores gives (MMA-Sim truncates the aligned sum to an
     integer, whose zero is unsigned: a negative sum that truncates to zero is ``+0``); no
     measured data set has the case.

5. Special values. Products are IEEE products (``inf * 0`` is NaN). Finite overflow in a
   rounding follows :attr:`Accumulator.overflow`: under ``"ieee"`` round-to-nearest (and stochastic)
   overflow to inf (NaN in formats without inf), toward_zero and the directed mode pointing
   inward stay at ``max``; ``"saturate"`` clamps to ``max``; ``"infinity"``: as ``"ieee"``,
   and moreover a value at or beyond ``max + ulp(max)`` (the next point of the grid without
   an exponent bound, ``2**(emax + 1)`` in IEEE formats) gives ±inf (NaN in formats without
   inf) in every rounding mode. ``"infinity"`` models a truncating datapath: NVIDIA tensor
   cores normalise the block sum and truncate its significand, and a sum whose exponent
   exceeds ``emax`` is inf, not ``max`` (MMA-Sim: the truncated significand times ``2**e``
   is converted to float32, which overflows to inf; e.g. Hopper wgmma bf16 ``a0 = 2**127``,
   ``b0 = 2``, ``c = 0`` gives 0x7f800000, and Ampere m16n8k16 bf16 with ``a0 = 2**127, b0 =
   2, a8 = -2**127, b8 = 4`` gives +inf where saturation then pulled the sum back to -max).

   Infinities and NaNs, from the inputs or from an overflow, are never rounded: they combine
   in IEEE float64 arithmetic, in the model's order of operations. Every step of the model
   (one addition of sequential, blocked, pairwise or compensated orders, one block FMA, one
   inner block, one promotion) whose running value or terms include a special value gives
   the IEEE sum of those special values (finite terms do not change an infinity): a NaN
   gives NaN, opposite infinities give NaN, otherwise the infinity. Once a partial sum is
   infinite it stays infinite, or becomes NaN on meeting the opposite infinity, as in IEEE
   arithmetic; so ``[65504, inf] @ [-2, 1]`` with an fp16 accumulator is NaN (the first step
   overflows to -inf, which then meets +inf), and ``[inf, 65504] @ [1, -2]`` is +inf. The
   output rounding of an infinity follows :attr:`Accumulator.overflow` (``"saturate"`` gives
   ``max``).
   ``order="blas"`` takes the special values of the IEEE float64 sum of the raw products.

   NaN results (:attr:`nan_encoding`): ``"quiet"`` (default) gives the positive quiet NaN on
   every backend (IEEE 754 leaves the sign and payload unspecified); ``"nvidia"`` gives
   NVIDIA's canonical NaN, all payload bits set: 0x7fffffff in float32 output arrays (which
   ``astype(np.float16)`` turns into fp16's 0x7fff), 0x7fffffffffffffff in float64 ones
   (MMA-Sim returns 0x7fffffff / 0x7fff for every NaN result; the PTX ISA documents the
   canonical NaN 0x7fffffff for float32 results).

6. Stochastic rounding. Every rounding event of an output element has an event number ``e``; the
   element with flat index ``i`` (C order over the broadcast batch shape x M x N, ``T`` elements in
   all) uses the 64-bit word number ``e * T + i`` of the counter-based generator of
   :mod:`precision_lab.core.random_words` keyed by :attr:`Accumulator.seed` (low ``64 -
   random_bits`` bits cleared). ``stochastic`` rounds away from zero iff ``floor(f * 2**64) + R >=
   2**64``, ``f`` the exact discarded fraction in units of the result's quantum;
   ``stochastic_equal`` rounds away from zero iff ``f != 0`` and the top bit of ``R`` is set
   (probability 1/2 whatever the distance); both are the rules of :func:`~precision_lab.round_to`,
   here applied to the exact intermediate, and every backend (numpy, native, CUDA) draws the same
   words. Event numbers:

   * sequential: the addition of ``p_k`` is event ``k``;
   * blocked: the in-block addition of ``p_k`` is event ``k``; the addition of the block sum of
     the block starting at ``k0`` into the running total is event ``K + k0 // block``;
   * pairwise: within the segment starting at ``k0``, the pair sums are numbered level by level,
     left to right, from 0; pair ``q`` is event ``k0 + q``; the final ``s0 + T`` is event
     ``K + k0``;
   * block_fma: the block starting at ``k0`` is event ``k0`` (its ``round(X)`` with
     ``in_block``, its ``round(X, acc, block_rounding)`` with ``after_block``); with inner
     blocks, inner block ``i`` of that block is event ``k0 + i``; the ``after_block``
     addition is event ``K + k0``;
   * compensated: ``t`` of step k is event ``k``, ``y`` event ``5K + k``,
     ``round(t - s)`` event ``6K + k``, ``c`` event ``7K + k``;
   * products rounded to ``product_format``: event ``4K + k``;
   * promotion of segment ``s``: event ``2K + s``; the output rounding: event ``3K``.

Float64 is used only where it is exact: products of inputs of at most 26 significant bits, sums
of block_fma's truncated integers, and a two-sum ``x + y = s + t`` (``s`` the float64 sum, ``t`` its
exact error) for every other addition. Non-stochastic roundings of ``s + t`` go through
round-to-odd at 53 bits (``s`` moved one ulp toward zero when ``t`` points inward, then its last
bit set when ``t != 0``), which is exact for targets of at most 51 significant bits: that is
why the accumulator format needs ``precision <= 51`` (``fp64`` is accepted with nearest_even,
where the float64 sum is already the answer).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..core.formats import FloatFormat, get_format
from ..core.random_words import check_seed
from ..core.rounding import (
    OVERFLOW_MODES,
    SR_VARIANT_MODES,
    SUBNORMAL_MODES,
    check_random_bits,
    check_rounding,
    is_stochastic,
)

__all__ = [
    "ACC_OVERFLOW_MODES",
    "ADDENDS",
    "INPUT_SUBNORMAL_MODES",
    "LANE_COMBINES",
    "LANE_TAILS",
    "NAN_ENCODINGS",
    "ORDERS",
    "PAIR_ORDERS",
    "SCALE_PLACEMENTS",
    "SPLIT_COMBINES",
    "SPLIT_HALVES",
    "TININESS_RULES",
    "ZERO_EXPONENT",
    "ZERO_SIGNS",
    "Accumulator",
    "combine_tree",
    "halving_cut",
    "join_tail",
    "reference_only",
    "split_chunks",
]

#: summation orders of :class:`Accumulator`
ORDERS = (
    "sequential",
    "pairwise",
    "blocked",
    "block_fma",
    "blas",
    "compensated",
    "exact_block",
)
#: named trees of :attr:`Accumulator.lane_combine` (spec 3e; an explicit tuple tree is allowed too)
LANE_COMBINES = ("sequential", "pairwise", "halving")
#: where the products past the last full row of lanes go (spec 3e)
LANE_TAILS = ("lanes", "after", "first", "separate", "separate_first")
#: how the K-chunks of :attr:`Accumulator.split_k` are combined (spec 3e)
SPLIT_COMBINES = ("sequential", "pairwise", "halving")
#: spec 3e: the half of a remainder under twice split_k (split_balance)
SPLIT_HALVES = ("ceil", "floor")
#: where a block-FMA unit adds the running accumulator
ADDENDS = ("in_block", "after_block", "separate")
#: where scales of block-quantized operands enter (see the spec, 3b)
SCALE_PLACEMENTS = ("promote", "in_block")
#: values of :attr:`Accumulator.overflow`: round_to's switches and a truncating datapath's
#: ``"infinity"`` (spec section 5)
ACC_OVERFLOW_MODES = (*OVERFLOW_MODES, "infinity")
#: values of :attr:`Accumulator.zero_sign` (spec section 4)
ZERO_SIGNS = ("ieee", "positive")
#: values of :attr:`Accumulator.nan_encoding` (spec section 5)
NAN_ENCODINGS = ("quiet", "nvidia")
#: values of :attr:`Accumulator.input_subnormals` (spec 3c)
INPUT_SUBNORMAL_MODES = (*SUBNORMAL_MODES, "flush_signed", "flush_signed_c", "flush_signed_fp16")
#: values of :attr:`Accumulator.pair_order` (spec 3d)
PAIR_ORDERS = ("natural", "odd_first")
#: values of :attr:`Accumulator.tininess` (spec 3d)
TININESS_RULES = ("subnormal_grid", "after_rounding")
#: default of :attr:`Accumulator.zero_exponent` (the alignment exponent of a zero product or a
#: zero running value with ``zeros_in_anchor``; spec section 3)
ZERO_EXPONENT = -126

_FP32 = get_format("fp32")
_FP64 = get_format("fp64")

#: a combination tree: a lane (or chunk) number, or a tuple of subtrees added left to right
Tree = Any


def combine_tree(kind: Any, n: int) -> Tree:
    """The tree that combines ``n`` values ``0 .. n-1`` (spec 3e): ``"sequential"``,
    ``"pairwise"``, ``"halving"``, or an explicit tree (returned as it is).

    >>> combine_tree("sequential", 4), combine_tree("pairwise", 5)
    ((((0, 1), 2), 3), (((0, 1), (2, 3)), 4))
    >>> combine_tree("halving", 8)
    (((0, 4), (2, 6)), ((1, 5), (3, 7)))
    """
    if not isinstance(kind, str):
        return kind
    if n < 1:
        raise ValueError(f"n must be a positive int, got {n}")
    items: list[Tree] = list(range(n))
    if kind == "sequential":
        node = items[0]
        for it in items[1:]:
            node = (node, it)
        return node
    if kind == "pairwise":
        while len(items) > 1:
            nxt = [(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]
            if len(items) % 2:
                nxt.append(items[-1])
            items = nxt
        return items[0]
    if kind == "halving":
        while len(items) > 1:
            h = (len(items) + 1) // 2
            items = [(items[i], items[i + h]) if i + h < len(items) else items[i] for i in range(h)]
        return items[0]
    raise ValueError(
        f"combine: must be one of {', '.join(LANE_COMBINES)} or a tuple tree, got {kind!r}"
    )


def join_tail(tree: Tree, vector: int | None, tail: int) -> Tree:
    """``tree`` with the leaf ``tail`` added to its largest subtree that holds lane 0 and only
    lanes ``= 0 (mod vector)`` (lane 0 alone without ``vector``): where ``lane_tail=
    "separate_first"``'s sum joins (spec 3e).

    >>> join_tail((((0, 2), (1, 3))), 2, -1)
    (((0, 2), -1), (1, 3))
    """
    v = vector or 1

    def leaves(t: Tree) -> list[int]:
        return [t] if not isinstance(t, tuple) else [x for ch in t for x in leaves(ch)]

    def walk(t: Tree) -> Tree:
        if all(x % v == 0 for x in leaves(t)):
            return (t, tail)
        assert isinstance(t, tuple)
        return tuple(walk(ch) if 0 in leaves(ch) else ch for ch in t)

    return walk(tree)


def prune_tree(tree: Tree, keep: int) -> Tree | None:
    """``tree`` without the leaves ``>= keep`` (one-child nodes collapsed); None when empty.

    >>> prune_tree(((0, 1), (2, 3)), 3)
    ((0, 1), 2)
    """
    if not isinstance(tree, tuple):
        return tree if tree < keep else None
    kids = [k for k in (prune_tree(ch, keep) for ch in tree) if k is not None]
    if not kids:
        return None
    return kids[0] if len(kids) == 1 else tuple(kids)


def split_chunks(
    n: int,
    size: int,
    balance: int | None = None,
    equal: int | None = None,
    half: str = "ceil",
) -> list[int]:
    """Lengths of the K-chunks of spec 3e's sequential split of ``n`` products.

    >>> split_chunks(10, 4), split_chunks(1000, 448, 4), split_chunks(66, 32, equal=2)
    ([4, 4, 2], [448, 276, 276], [22, 22, 22])
    >>> split_chunks(641, 320, 8, half="floor"), split_chunks(641, 320, 1)
    ([320, 160, 161], [320, 161, 160])
    """
    if equal is not None and n > 0:
        m = -(-n // size)
        if n % m == 0 and (n // m) % equal == 0:
            return [n // m] * m
    out: list[int] = []
    left = n
    while left > 0:
        if balance is None or left >= 2 * size:
            step = min(size, left)
        elif left > size:
            h = (left + 1) // 2 if half == "ceil" else left // 2
            step = min(left, -(-h // balance) * balance)
        else:
            step = left
        out.append(step)
        left -= step
    return out


def halving_cut(n: int, lanes: int | None) -> int:
    """Where spec 3e's ``split_combine="halving"`` cuts a range of ``n`` products: ``n // 2``
    rounded down to a multiple of ``lanes`` (numpy's ``pairwise_sum``).

    >>> halving_cut(200, 8), halving_cut(129, 8)
    (96, 64)
    """
    h = n // 2
    return h - h % (lanes or 1)


def _as_tuple_tree(tree: Any) -> Any:
    """Lists in a tree (from JSON, say) as tuples, so that the Accumulator stays hashable."""
    return tuple(_as_tuple_tree(t) for t in tree) if isinstance(tree, list | tuple) else tree


def _check_tree(tree: Any, lanes: int) -> None:
    """An explicit lane tree: nested tuples holding each lane 0 .. lanes-1 exactly once."""
    seen: list[int] = []

    def walk(node: Any) -> None:
        if isinstance(node, tuple):
            if len(node) < 2:
                raise ValueError(
                    f"lane_combine: every tuple of the tree needs at least 2 children, got {node!r}"
                )
            for ch in node:
                walk(ch)
        elif isinstance(node, int) and not isinstance(node, bool):
            seen.append(node)
        else:
            raise ValueError(f"lane_combine: tree leaves must be lane numbers (ints), got {node!r}")

    walk(tree)
    if sorted(seen) != list(range(lanes)):
        raise ValueError(
            f"lane_combine: the tree must hold each lane 0..{lanes - 1} exactly once, got "
            f"{sorted(seen)}"
        )


def _float_format(value: Any, name: str) -> FloatFormat:
    try:
        fmt = get_format(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name}: {exc}") from None
    if not isinstance(fmt, FloatFormat):
        raise ValueError(f"{name} must be a floating-point format, got integer format {fmt}")
    return fmt


def _format_pair(input_format: Any) -> tuple[FloatFormat, FloatFormat]:
    """``input_format`` of a GEMM: one format for both operands, or a pair ``(fa, fb)``."""
    if isinstance(input_format, tuple | list):
        if len(input_format) != 2:
            raise ValueError(
                f"input_format must be one format or a pair (format_a, format_b), got "
                f"{len(input_format)} items"
            )
        return (
            _float_format(input_format[0], "input_format[0]"),
            _float_format(input_format[1], "input_format[1]"),
        )
    fmt = _float_format(input_format, "input_format")
    return fmt, fmt


def _positive_int(value: Any, name: str, *, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{name} must be a positive int{' or None' if allow_none else ''}, got {value!r}"
        )
    return int(value)


@dataclass(frozen=True)
class Accumulator:
    """How one inner product ``c + sum_k a_k b_k`` is accumulated (see the module docstring).

    Parameters
    ----------
    format:
        Accumulator format (any float format: ``"fp32"``, ``"bf16"``, ``"fp16"``,
        ``FloatFormat(8, 13)`` ...), at most 51 significant bits (or ``"fp64"`` with
        nearest_even).
    rounding:
        Rounding mode of every accumulation step (``nearest_even``, ``toward_zero``,
        ``stochastic``, ``stochastic_equal`` ... every mode and alias of
        :func:`~precision_lab.round_to`).
    order:
        ``"sequential"`` (recursive summation), ``"pairwise"``, ``"blocked"`` (needs ``block``),
        ``"block_fma"`` (tensor-core block FMA: needs ``block`` and ``align_bits``),
        ``"compensated"`` (Kahan, the compensation held in ``format``; numpy backend
        only) or ``"blas"`` (float32 BLAS matmul: fast, not bit-reproducible).
    block:
        Block length of ``blocked``, products per block FMA of ``block_fma``.
    promote_every:
        Promote the partial sum into the wide accumulator every this many products (DeepSeek-V3:
        128); ``None``: no promotion.
    promote_format, promote_rounding:
        Format and rounding of the wide accumulator that takes promoted partial sums.
    product_format, product_rounding:
        ``None``: exact products (tensor cores, FMA). A format: each product is rounded to it
        first (separate multiply and add).
    align_bits:
        ``block_fma``: fraction bits kept below the anchor exponent when terms are aligned
        (23 + extra alignment bits: V100 23, A100 24, H100 25; H100 FP8 13).
    addend:
        ``block_fma``: ``"in_block"`` (the running accumulator is aligned with the products of
        each block) or ``"after_block"`` (the products' block sum is rounded with
        ``block_rounding`` to ``format``, then added to the running accumulator with
        ``rounding``).
    block_rounding:
        Rounding of the block sum with ``addend="after_block"`` (and of every inner block).
    inner_block:
        ``block_fma`` with ``addend="after_block"``: the block sum is a chain of inner block
        FMAs of this many products each, starting from 0 (``None``: one block FMA). Must
        divide ``block``.
    inner_interleave:
        Run length in which the block's products are dealt to the inner blocks (``None``:
        ``inner_block``, contiguous); must divide ``inner_block``. FP8 ``mma.sync`` emulated
        on fp16 tensor cores (Hopper, Blackwell): ``block=32, inner_block=16,
        inner_interleave=2``.
    sum_bits, align_rounding:
        ``addend="separate"`` (AMD CDNA3): MMA-Sim's F2 = 31 (the products' block sum is cut to
        ``sum_bits + 1`` fraction bits below the common anchor, the sum with the running value
        to ``sum_bits`` below its own exponent), and how every cut of that model is made
        (``"toward_zero"`` or ``"down"``: floor, as CDNA3).
    drop_bits:
        ``addend="separate"``: the running value is dropped (taken as 0) when its exponent lies
        below the common anchor minus ``drop_bits`` (MMA-Sim's GTR-FDPA, CDNA3 fp8/bf8:
        ``align_bits + 1``); ``None``: never.
    scales:
        ``"promote"`` (scales of block-quantized operands multiply each scale block's partial
        sum at promotion, DeepSeek-V3) or ``"in_block"`` (they enter the block FMA's terms:
        block-scaled tensor-core MMA; spec 3b).
    group:
        ``scales="in_block"``: products summed exactly in groups of this many before their
        scales are applied (``kind::mxf4nvf4``: 16); ``None``: each product is a term.
    scale_format:
        ``group``: the scales' format, whose ``emin`` is the least alignment exponent of a
        scale (UE4M3 ``"e4m3"``: subnormal scales; ``None``: E8M0, exact powers of two).
    input_subnormals:
        ``"keep"``, ``"flush"`` (subnormal inputs a, b and c become +0 first: AMD CDNA2) or
        ``"flush_signed"`` (they become a zero of their sign: x86 DAZ, Arm FPCR.FIZ; spec 3c);
        ``"flush_signed_c"``: only c does (x86 AMX-FP16).
    pair_order:
        ``"natural"`` or ``"odd_first"``: the products of each pair ``(2i, 2i + 1)`` are taken
        odd one first (x86 VDPBF16PS; spec 3d).
    tininess:
        With ``subnormals="flush"``: ``"subnormal_grid"`` (a result whose rounding onto the
        subnormal grid is subnormal is flushed) or ``"after_rounding"`` (IEEE 754's tininess
        after rounding, as x86 MXCSR.FTZ: the value rounded with an unbounded exponent is
        below the smallest normal; spec 3d).
    out_rounding:
        Rounding of the final conversion to the output format.
    overflow:
        Overflow of every rounding of the model: ``"ieee"`` and ``"saturate"`` as in
        :func:`~precision_lab.round_to`, or ``"infinity"``: a finite value beyond the format's
        range gives ±inf whatever the rounding mode (a truncating datapath, not IEEE's
        directed rounding: toward_zero of a value at or above ``max + ulp(max)`` gives inf, not
        ``max``; spec section 5).
    subnormals:
        Switch of :func:`~precision_lab.round_to` for every rounding of the model.
    zeros_in_anchor:
        ``block_fma`` only: a zero product and a zero running value take part in the block's
        alignment anchor with the exponent :attr:`zero_exponent` (NVIDIA tensor cores, spec
        section 3); ``False``: zeros take no part.
    c_format:
        The type of C where it differs from the output's (Volta's and Turing's
        ``mma.m8n8k4.f32.f16.f16.f16``: ``"fp16"``; spec section 1); ``None``: ``out_format``.
    zero_exponent:
        The alignment exponent of a zero with ``zeros_in_anchor`` (MMA-Sim's ``e_zero``: a
        constant per architecture and output type, e.g. -133 for Hopper with fp32 output, -21
        with fp16 output); default ``ZERO_EXPONENT`` (-126).
    zero_sign:
        Sign of a zero result of a rounding (an exact cancellation or an underflow):
        ``"ieee"`` (IEEE 754 section 6.3: a tiny negative value rounds to -0, an exact zero
        sum is +0, -0 under ``down`` or when both addends are -0; a block FMA's exact zero sum
        is +0) or ``"positive"`` (always +0, as a fixed-point datapath gives; spec section 4).
    nan_encoding:
        Bits of a NaN result: ``"quiet"`` (the positive quiet NaN, 0x7fc00000 in float32) or
        ``"nvidia"`` (NVIDIA's canonical NaN, 0x7fffffff in float32, 0x7fff in fp16,
        all payload bits set in float64; spec section 5).
    seed, random_bits:
        Stochastic rounding: seed of the counter-based random words (``None``: 0, so results
        are reproducible by default) and the number of random bits (``None``: exact).
    lanes:
        Interleaved partial sums (SIMD lanes, spec 3e): product ``k`` of a range goes to lane
        ``k mod lanes``, each lane its own accumulator reduced by :attr:`order`; ``None``: one.
    lane_combine:
        How the lane values are combined: ``"sequential"`` (``((l0 + l1) + l2) + l3``),
        ``"pairwise"`` (``(l0 + l1) + (l2 + l3)``), ``"halving"`` (SIMD horizontal reduction,
        ``l_i + l_{i+L/2}`` first) or an explicit tree of nested tuples of lane numbers.
    lane_tail:
        Where the products past the main loop (the last ``K mod lane_unroll``) go:
        ``"lanes"`` (to their lanes, ``k mod lanes``), ``"after"`` (added one by one after the
        lanes are combined: numpy), ``"first"`` (added one by one to lane 0 before the lanes
        are combined: torch bf16), ``"separate"`` (summed apart, then added: OpenBLAS sdot) or
        ``"separate_first"`` (summed apart, then added to the lane tree's first top-level
        child before the top-level combination: torch.sum).
    lane_run:
        Products dealt to the lanes in runs of this many (``lane_tail="lanes"``): run ``r``
        (products ``rR .. rR + R - 1``) goes to lane ``r mod lanes``, summed first (each
        addition rounded), then added to its lane (x86 AMX-FP8: 2; numpy reference only).
    tail_format, tail_product_format:
        ``lane_tail="separate"``: the format the tail is summed in, from ``+0``, and the lanes'
        value added to it before the result is rounded to :attr:`format` (``None``: the
        accumulator's); the format each tail product is rounded to first (``None``: exact).
        OpenBLAS's Haswell ``sdot``: ``"fp64"`` and ``"fp32"`` (numpy reference only).
    lane_unroll:
        The main loop's step (a multiple of ``lanes``; ``None``: ``lanes``): the tail is the
        last ``K mod lane_unroll`` products.
    lane_vector:
        A cleanup loop after the main one (a divisor of ``lanes``): the products up to the
        last ``K mod lane_vector`` go, this many at a time, to lanes ``0 .. lane_vector - 1``
        (one vector accumulator), and only the rest is the tail (torch.sum: 8).
    small_k:
        Ranges of fewer products than this skip the lanes (a small-K kernel): reduced by
        :attr:`order` alone; ``None``: lanes whatever the length.
    split_k:
        K-blocking: chunks of this many products, each reduced with the lanes, combined by
        :attr:`split_combine` (``"halving"``: numpy's recursive halving down to ranges of at
        most ``split_k``).
    split_combine:
        ``"sequential"`` (each chunk added into the running sum that starts at ``c``: BLAS
        K-blocking), ``"pairwise"`` or ``"halving"`` (spec 3e).
    split_balance:
        ``split_combine="sequential"``: a remainder between ``split_k`` and twice it is cut in
        two halves, rounded up to a multiple of this (OpenBLAS: ``GEMM_UNROLL_M``); ``None``:
        chunks of ``split_k``.
    split_half:
        With :attr:`split_balance`: the half of that remainder before rounding, ``"ceil"``
        (OpenBLAS's threaded driver) or ``"floor"`` (its single-thread driver).
    split_equal:
        ``split_combine="sequential"``: ``ceil(K / split_k)`` equal chunks where their length
        is a whole multiple of this, else chunks of ``split_k`` (oneDNN's AMX brgemm: 2).
    k1_product:
        ``K = 1`` without ``c`` gives the product itself, rounded once (a ``-0`` product stays
        ``-0``; spec 3f): an outer-product path; ``False``: ``0 + p_0``.
    switch_k, long_kernel:
        Spec 3g: a GEMM of more than ``switch_k`` products is ``long_kernel``'s (an
        :class:`Accumulator`); both or neither. :meth:`for_k` gives the model of a K.
    name:
        A label (not part of equality), e.g. the preset's name.

    Examples
    --------
    >>> Accumulator("fp16", rounding="rtz", order="blocked", block=32).block
    32
    >>> Accumulator(order="blocked")
    Traceback (most recent call last):
    ...
    ValueError: block: order='blocked' needs a block length (a positive int), got None
    """

    format: str | FloatFormat = "fp32"
    rounding: str = "nearest_even"
    order: str = "sequential"
    block: int | None = None
    promote_every: int | None = None
    promote_format: str | FloatFormat = "fp32"
    promote_rounding: str = "nearest_even"
    product_format: str | FloatFormat | None = None
    product_rounding: str = "nearest_even"
    align_bits: int | None = None
    addend: str = "in_block"
    block_rounding: str = "toward_zero"
    out_rounding: str = "nearest_even"
    overflow: str = "ieee"
    subnormals: str = "keep"
    seed: int | None = None
    random_bits: int | None = None
    inner_block: int | None = None
    inner_interleave: int | None = None
    sum_bits: int | None = None
    align_rounding: str = "toward_zero"
    drop_bits: int | None = None
    scales: str = "promote"
    group: int | None = None
    scale_format: str | FloatFormat | None = None
    input_subnormals: str = "keep"
    pair_order: str = "natural"
    tininess: str = "subnormal_grid"
    zeros_in_anchor: bool = False
    zero_exponent: int = -126
    c_format: str | FloatFormat | None = None
    zero_sign: str = "ieee"
    nan_encoding: str = "quiet"
    lanes: int | None = None
    lane_combine: str | tuple[Any, ...] = "sequential"
    lane_tail: str = "lanes"
    lane_unroll: int | None = None
    lane_run: int | None = None
    tail_format: str | FloatFormat | None = None
    tail_product_format: str | FloatFormat | None = None
    lane_vector: int | None = None
    small_k: int | None = None
    split_k: int | None = None
    split_combine: str = "sequential"
    split_balance: int | None = None
    split_half: str = "ceil"
    split_equal: int | None = None
    k1_product: bool = False
    switch_k: int | None = None
    long_kernel: Accumulator | None = None
    name: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: normalise the fields in place once
        fmt = _float_format(self.format, "format")
        put(self, "format", fmt)
        for mode_field in (
            "rounding",
            "promote_rounding",
            "product_rounding",
            "block_rounding",
            "out_rounding",
        ):
            try:
                put(self, mode_field, check_rounding(getattr(self, mode_field)))
            except ValueError as exc:
                raise ValueError(f"{mode_field}: {exc}") from None
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        if self.addend not in ADDENDS:
            raise ValueError(f"addend must be one of {', '.join(ADDENDS)}, got {self.addend!r}")
        if self.overflow not in ACC_OVERFLOW_MODES:
            raise ValueError(
                f"overflow must be one of {', '.join(ACC_OVERFLOW_MODES)}, got {self.overflow!r}"
            )
        if self.zero_sign not in ZERO_SIGNS:
            raise ValueError(
                f"zero_sign must be one of {', '.join(ZERO_SIGNS)}, got {self.zero_sign!r}"
            )
        if self.nan_encoding not in NAN_ENCODINGS:
            raise ValueError(
                f"nan_encoding must be one of {', '.join(NAN_ENCODINGS)}, got {self.nan_encoding!r}"
            )
        if not isinstance(self.zeros_in_anchor, bool):
            raise ValueError(f"zeros_in_anchor must be True or False, got {self.zeros_in_anchor!r}")
        if (
            isinstance(self.zero_exponent, bool)
            or not isinstance(self.zero_exponent, int)
            or not -1100 <= self.zero_exponent <= 1100
        ):
            raise ValueError(
                f"zero_exponent must be an int in -1100..1100, got {self.zero_exponent!r}"
            )
        object.__setattr__(self, "zero_exponent", int(self.zero_exponent))
        if self.c_format is not None:
            put(self, "c_format", _float_format(self.c_format, "c_format"))
            if (
                self.order != "block_fma"
                or self.addend != "in_block"
                or self.promote_every is not None
            ):
                raise ValueError(
                    f"c_format needs order='block_fma', addend='in_block' and no promotion, got "
                    f"order={self.order!r}, addend={self.addend!r}, "
                    f"promote_every={self.promote_every!r}"
                )
        if self.zeros_in_anchor and self.order != "block_fma":
            raise ValueError(
                f"zeros_in_anchor=True needs order='block_fma' (zeros in a block's alignment "
                f"anchor), got order={self.order!r}"
            )
        if self.subnormals not in SUBNORMAL_MODES:
            raise ValueError(
                f"subnormals must be one of {SUBNORMAL_MODES}, got {self.subnormals!r}"
            )
        put(self, "promote_format", _float_format(self.promote_format, "promote_format"))
        if self.product_format is not None:
            put(self, "product_format", _float_format(self.product_format, "product_format"))
        put(self, "promote_every", _positive_int(self.promote_every, "promote_every"))
        if self.order in ("blocked", "block_fma", "exact_block"):
            if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1:
                raise ValueError(
                    f"block: order={self.order!r} needs a block length (a positive int), "
                    f"got {self.block!r}"
                )
        else:
            put(self, "block", _positive_int(self.block, "block"))
        if self.order == "block_fma":
            nb = (self.block or 1).bit_length()
            if (
                isinstance(self.align_bits, bool)
                or not isinstance(self.align_bits, int)
                or not 0 <= self.align_bits <= 50 - nb
            ):
                raise ValueError(
                    f"align_bits: order='block_fma' needs the number of fraction bits kept "
                    f"after alignment, an int in 0..{50 - nb} for block={self.block}, "
                    f"got {self.align_bits!r}"
                )
        self._check_extensions()
        self._check_lanes()
        put(self, "switch_k", _positive_int(self.switch_k, "switch_k"))
        if (self.switch_k is None) != (self.long_kernel is None):
            raise ValueError(
                f"switch_k and long_kernel go together (spec 3g), got switch_k={self.switch_k!r}, "
                f"long_kernel={self.long_kernel!r}"
            )
        if self.long_kernel is not None and not isinstance(self.long_kernel, Accumulator):
            raise TypeError(
                f"long_kernel must be an Accumulator, got {type(self.long_kernel).__name__}"
            )
        put(self, "inner_block", _positive_int(self.inner_block, "inner_block"))
        put(self, "inner_interleave", _positive_int(self.inner_interleave, "inner_interleave"))
        if self.inner_block is not None:
            if self.order != "block_fma" or self.addend == "in_block":
                raise ValueError(
                    f"inner_block needs order='block_fma' and addend='after_block' or "
                    f"'separate', got "
                    f"order={self.order!r}, addend={self.addend!r}"
                )
            assert self.block is not None
            if self.block % self.inner_block:
                raise ValueError(
                    f"inner_block must divide block={self.block}, got {self.inner_block}"
                )
        if self.inner_interleave is not None:
            if self.inner_block is None:
                raise ValueError(
                    f"inner_interleave needs inner_block, got inner_interleave="
                    f"{self.inner_interleave} with inner_block=None"
                )
            if self.inner_block % self.inner_interleave:
                raise ValueError(
                    f"inner_interleave must divide inner_block={self.inner_block}, "
                    f"got {self.inner_interleave}"
                )
        for name_, f in (("format", fmt), ("promote_format", self.promote_format)):
            assert isinstance(f, FloatFormat)
            mode = self.rounding if name_ == "format" else self.promote_rounding
            if f.precision > 51 and not (f == _FP64 and mode == "nearest_even"):
                raise ValueError(
                    f"{name_} {f} has {f.precision} significant bits: at most 51 are supported "
                    "(exact single rounding via round-to-odd in float64), or fp64 with "
                    "nearest_even"
                )
        if self.order == "blas" and (fmt != _FP32 or self.rounding != "nearest_even"):
            raise ValueError(
                f"order='blas' is float32 BLAS summation: format must be fp32 and rounding "
                f"nearest_even, got format={fmt}, rounding={self.rounding!r}"
            )
        if self.random_bits is not None:  # numpy integers accepted, as by round_to
            object.__setattr__(self, "random_bits", check_random_bits(self.random_bits))
        for mode_field in (
            "rounding",
            "promote_rounding",
            "product_rounding",
            "block_rounding",
            "out_rounding",
        ):  # the few-bit SR variants: "stochastic" itself with 64 bits, else not modelled here
            mode = getattr(self, mode_field)
            if mode in SR_VARIANT_MODES:
                if self.random_bits not in (None, 64):
                    raise ValueError(
                        f"{mode_field}={mode!r} with random_bits={self.random_bits} is not "
                        "supported by accumulators (round_to, encode and the block "
                        "quantizers serve it); use 'stochastic'"
                    )
                put(self, mode_field, "stochastic")
        if self.seed is not None:
            object.__setattr__(self, "seed", check_seed(self.seed))

    def _check_extensions(self) -> None:
        """Checks of the fields of spec 3b, 3c, ``addend="separate"`` and ``exact_block``."""
        put = object.__setattr__
        for name_, value, allowed in (
            ("align_rounding", self.align_rounding, ("toward_zero", "down")),
            ("scales", self.scales, SCALE_PLACEMENTS),
            ("input_subnormals", self.input_subnormals, INPUT_SUBNORMAL_MODES),
            ("pair_order", self.pair_order, PAIR_ORDERS),
            ("tininess", self.tininess, TININESS_RULES),
        ):
            if value not in allowed:
                raise ValueError(f"{name_} must be one of {', '.join(allowed)}, got {value!r}")
        fmt = self.format
        assert isinstance(fmt, FloatFormat)
        if self.tininess == "after_rounding" and (
            self.subnormals != "flush"
            or self.stochastic
            or self.order != "sequential"
            or fmt.precision > 51
        ):
            raise ValueError(
                "tininess='after_rounding' needs subnormals='flush', deterministic rounding, "
                f"order='sequential' and a format of at most 51 bits, got "
                f"subnormals={self.subnormals!r}, order={self.order!r}, "
                f"stochastic={self.stochastic}, format={fmt}"
            )
        put(self, "group", _positive_int(self.group, "group"))
        if self.scale_format is not None:
            put(self, "scale_format", _float_format(self.scale_format, "scale_format"))
        put(self, "sum_bits", _positive_int(self.sum_bits, "sum_bits"))
        if self.addend == "separate":
            if self.order != "block_fma" or self.sum_bits is None or self.sum_bits > 48:
                raise ValueError(
                    f"addend='separate' needs order='block_fma' and sum_bits (an int in "
                    f"1..48), got order={self.order!r}, sum_bits={self.sum_bits!r}"
                )
        elif self.sum_bits is not None:
            raise ValueError(f"sum_bits needs addend='separate', got addend={self.addend!r}")
        put(self, "drop_bits", _positive_int(self.drop_bits, "drop_bits"))
        if self.drop_bits is not None and (self.addend != "separate" or self.drop_bits > 200):
            raise ValueError(
                f"drop_bits needs addend='separate' and at most 200, got drop_bits="
                f"{self.drop_bits}, addend={self.addend!r}"
            )
        if self.scales == "in_block":
            if self.order != "block_fma" or self.addend not in ("in_block", "separate"):
                raise ValueError(
                    f"scales='in_block' needs order='block_fma' and addend='in_block' or "
                    f"'separate', got order={self.order!r}, addend={self.addend!r}"
                )
            if self.addend == "separate" and self.group is not None:
                raise ValueError(
                    f"scales='in_block' with addend='separate' takes no group, got "
                    f"group={self.group}"
                )
            if self.promote_every is not None:
                raise ValueError(
                    f"scales='in_block' takes no promotion, got promote_every={self.promote_every}"
                )
        if self.group is not None:
            if self.scales != "in_block" or (self.block or 1) % self.group:
                raise ValueError(
                    f"group needs scales='in_block' and must divide block={self.block}, got "
                    f"group={self.group}, scales={self.scales!r}"
                )
        if self.order == "exact_block" and (
            self.product_format is not None or is_stochastic(check_rounding(self.rounding))
        ):
            raise ValueError(
                "order='exact_block' sums exact products with one deterministic rounding per "
                f"block, got product_format={self.product_format!r}, rounding={self.rounding!r}"
            )

    def _check_lanes(self) -> None:
        """Checks of spec 3e's fields (lanes and split-K)."""
        put = object.__setattr__
        put(self, "lanes", _positive_int(self.lanes, "lanes"))
        put(self, "small_k", _positive_int(self.small_k, "small_k"))
        put(self, "split_k", _positive_int(self.split_k, "split_k"))
        put(self, "split_balance", _positive_int(self.split_balance, "split_balance"))
        if self.split_balance is not None and (
            self.split_k is None or self.split_combine != "sequential"
        ):
            raise ValueError(
                f"split_balance needs split_k and split_combine='sequential', got split_k="
                f"{self.split_k}, split_combine={self.split_combine!r}"
            )
        if self.split_half not in SPLIT_HALVES:
            raise ValueError(f"split_half must be one of {SPLIT_HALVES}, got {self.split_half!r}")
        if self.split_half != "ceil" and self.split_balance is None:
            raise ValueError(
                f"split_half={self.split_half!r} needs split_balance (the remainder it halves)"
            )
        put(self, "split_equal", _positive_int(self.split_equal, "split_equal"))
        if self.split_equal is not None and (
            self.split_k is None
            or self.split_combine != "sequential"
            or self.split_balance is not None
        ):
            raise ValueError(
                f"split_equal needs split_k, split_combine='sequential' and no split_balance, "
                f"got split_k={self.split_k}, split_combine={self.split_combine!r}, "
                f"split_balance={self.split_balance}"
            )
        for name in ("tail_format", "tail_product_format"):
            if getattr(self, name) is not None:
                put(self, name, _float_format(getattr(self, name), name))
        if self.tail_format is not None and (
            self.lanes is None or self.lane_tail != "separate" or self.stochastic
        ):
            raise ValueError(
                f"tail_format needs lanes, lane_tail='separate' and a deterministic rounding, "
                f"got lanes={self.lanes}, lane_tail={self.lane_tail!r}, "
                f"rounding={self.rounding!r}"
            )
        if self.tail_product_format is not None and self.tail_format is None:
            raise ValueError(
                f"tail_product_format={str(self.tail_product_format)!r} needs tail_format (the "
                "format the tail is summed in)"
            )
        if not isinstance(self.k1_product, bool):
            raise ValueError(f"k1_product must be True or False, got {self.k1_product!r}")
        put(self, "lane_unroll", _positive_int(self.lane_unroll, "lane_unroll"))
        if self.lane_unroll is not None and (
            self.lanes is None or self.lane_unroll % self.lanes or self.lane_tail == "lanes"
        ):
            raise ValueError(
                f"lane_unroll must be a multiple of lanes={self.lanes} with lane_tail other than "
                f"'lanes', got lane_unroll={self.lane_unroll}, lane_tail={self.lane_tail!r}"
            )
        put(self, "lane_run", _positive_int(self.lane_run, "lane_run"))
        if self.lane_run is not None and (
            self.lanes is None
            or self.lane_tail != "lanes"
            or self.order != "sequential"
            or self.small_k is not None
        ):
            raise ValueError(
                f"lane_run needs lanes, lane_tail='lanes', order='sequential' and no small_k, "
                f"got lanes={self.lanes}, lane_tail={self.lane_tail!r}, order={self.order!r}, "
                f"small_k={self.small_k}"
            )
        put(self, "lane_vector", _positive_int(self.lane_vector, "lane_vector"))
        if self.lane_vector is not None and (
            self.lanes is None
            or self.lanes % self.lane_vector
            or self.lane_vector == self.lanes
            or self.lane_tail in ("lanes", "first")
        ):
            raise ValueError(
                f"lane_vector must divide lanes={self.lanes} (and be fewer) with lane_tail "
                f"'after', 'separate' or 'separate_first', got lane_vector={self.lane_vector}, "
                f"lane_tail={self.lane_tail!r}"
            )
        if self.lane_tail not in LANE_TAILS:
            raise ValueError(
                f"lane_tail must be one of {', '.join(LANE_TAILS)}, got {self.lane_tail!r}"
            )
        if self.split_combine not in SPLIT_COMBINES:
            raise ValueError(
                f"split_combine must be one of {', '.join(SPLIT_COMBINES)}, got "
                f"{self.split_combine!r}"
            )
        if isinstance(self.lane_combine, list):
            put(self, "lane_combine", _as_tuple_tree(self.lane_combine))
        if isinstance(self.lane_combine, str):
            if self.lane_combine not in LANE_COMBINES:
                raise ValueError(
                    f"lane_combine must be one of {', '.join(LANE_COMBINES)} or a tuple tree of "
                    f"lane numbers, got {self.lane_combine!r}"
                )
        elif self.lanes is None:
            raise ValueError(
                f"lane_combine: an explicit tree needs lanes, got lane_combine="
                f"{self.lane_combine!r} with lanes=None"
            )
        else:
            _check_tree(self.lane_combine, self.lanes)
        if self.lanes is None and self.split_k is None:
            if self.small_k is not None:
                raise ValueError(f"small_k needs lanes, got small_k={self.small_k} with lanes=None")
            return
        if self.order not in ("sequential", "pairwise", "blocked"):
            raise ValueError(
                f"lanes and split_k need order 'sequential', 'pairwise' or 'blocked' (the order "
                f"within a lane), got order={self.order!r}"
            )
        if self.stochastic:
            raise ValueError(
                "lanes and split_k model CPU SIMD libraries: deterministic rounding modes only, "
                f"got rounding={self.rounding!r}, out_rounding={self.out_rounding!r}"
            )

    def for_k(self, k: int) -> Accumulator:
        """The model of a GEMM of ``k`` products (spec 3g): this one, or past :attr:`switch_k`
        :attr:`long_kernel`'s.

        >>> acc = Accumulator("fp32", lanes=4, switch_k=64, long_kernel=Accumulator("fp32"))
        >>> acc.for_k(64).lanes, acc.for_k(65).lanes
        (4, None)
        """
        acc = self
        while acc.switch_k is not None and k > acc.switch_k:
            assert acc.long_kernel is not None
            acc = acc.long_kernel
        return acc

    def fields_3d_default(self) -> bool:
        """Whether spec 3e's structure is off (no lanes, no split-K).

        >>> Accumulator().fields_3d_default(), Accumulator(lanes=4).fields_3d_default()
        (True, False)
        """
        return self.lanes is None and self.split_k is None

    @property
    def stochastic(self) -> bool:
        """Whether any rounding of the model is stochastic (it then uses :attr:`seed`)."""
        modes = [self.rounding, self.out_rounding]
        if self.promote_every is not None:
            modes.append(self.promote_rounding)
        if self.product_format is not None:
            modes.append(self.product_rounding)
        if self.order == "block_fma" and self.addend == "after_block":
            modes.append(self.block_rounding)
        return any(is_stochastic(m) for m in modes)

    def replace(self, **changes: Any) -> Accumulator:
        """A copy with some fields changed (:func:`dataclasses.replace`).

        >>> Accumulator("fp16").replace(rounding="rtz").rounding
        'toward_zero'
        """
        return dataclasses.replace(self, **changes)

    def segments(self, k: int, kblock: int | None, scaled: bool) -> tuple[bool, int]:
        """(promote?, segment length) of a K-long sum: promotion every N, the K-blocks of the
        scales, or one scaled segment.

        >>> Accumulator("bf16", promote_every=128).segments(4096, None, False)
        (True, 128)
        """
        seg = self.promote_every
        if kblock is not None:
            if seg is None:
                seg = kblock
            elif kblock % seg:
                raise ValueError(
                    f"promote_every={seg} must divide the K-block of the scales ({kblock})"
                )
        return seg is not None or scaled, seg if seg is not None else max(k, 1)

    def describe(self) -> str:
        """One line saying what the model does.

        >>> Accumulator("bf16", promote_every=128).describe()
        'sequential sum in bf16 (nearest_even), promoted every 128 products into fp32'
        """
        fmt = self.format
        if self.order == "exact_block":
            txt = (
                f"exact sum of each block of {self.block} products and the accumulator, "
                f"rounded once into {fmt} ({self.rounding})"
            )
        elif self.order == "block_fma" and self.addend == "separate":
            inner = ""
            if self.inner_block is not None:
                inner = (
                    f" as {(self.block or 0) // self.inner_block} blocks of {self.inner_block} "
                    f"(dealt in runs of {self.inner_interleave or self.inner_block})"
                )
            drop = (
                ""
                if self.drop_bits is None
                else f", the accumulator dropped {self.drop_bits} binades below"
            )
            txt = (
                f"block FMA of {self.block} products{inner} aligned to their own maximum "
                f"exponent ({self.align_bits} fraction bits), then the block sum "
                f"({(self.sum_bits or 0) + 1} bits) and the accumulator ({self.align_bits} bits) "
                f"aligned{drop}, their sum normalised to {self.sum_bits} bits "
                f"({self.align_rounding}) and rounded into {fmt} ({self.rounding})"
            )
        elif self.order == "block_fma":
            txt = (
                f"block FMA of {self.block} products, {self.align_bits} fraction bits kept "
                f"after alignment, normalised into {fmt} ({self.rounding})"
            )
            if self.inner_block is not None:
                runs = self.inner_interleave or self.inner_block
                txt = (
                    f"block FMA of {self.block} products as "
                    f"{(self.block or 0) // self.inner_block} "
                    f"chained blocks of {self.inner_block} (dealt in runs of {runs}), "
                    f"{self.align_bits} fraction bits kept after alignment, normalised into "
                    f"{fmt} ({self.block_rounding}), then added to the accumulator "
                    f"({self.rounding})"
                )
            elif self.addend == "after_block":
                txt += f", block sum rounded {self.block_rounding} before the accumulator add"
        elif self.order == "blocked":
            txt = f"blocked sum (block {self.block}) in {fmt} ({self.rounding})"
        elif self.order == "compensated":
            txt = f"compensated (Kahan) sum in {fmt} ({self.rounding})"
        elif self.order == "blas":
            txt = "float32 BLAS matmul"
        else:
            txt = f"{self.order} sum in {fmt} ({self.rounding})"
        txt += self._lanes_text()
        if self.scales == "in_block":
            txt += (
                ", block scales applied to each product"
                if self.group is None
                else f", block scales applied to sums of {self.group} products"
            )
        if self.input_subnormals == "flush":
            txt += ", subnormal inputs flushed"
        elif self.input_subnormals == "flush_signed":
            txt += ", subnormal inputs flushed to signed zeros"
        elif self.input_subnormals == "flush_signed_c":
            txt += ", a subnormal c flushed to a signed zero"
        elif self.input_subnormals == "flush_signed_fp16":
            txt += ", inputs below fp16's normal range and a subnormal c flushed to signed zeros"
        if self.pair_order == "odd_first":
            txt += ", each pair of products odd one first"
        if self.c_format is not None:
            txt += f", c in {self.c_format}"
        if self.product_format is not None:
            txt += f", products rounded to {self.product_format} ({self.product_rounding})"
        if self.promote_every is not None:
            txt += f", promoted every {self.promote_every} products into {self.promote_format}"
        txt += self._special_rules()
        if self.long_kernel is not None and self.switch_k is not None:
            txt += f"; from K = {self.switch_k + 1}: {self.long_kernel.describe()}"
        if self.name:
            txt += f" [{self.name}]"
        return txt

    def _lanes_text(self) -> str:
        """Spec 3e's structure, as a part of :meth:`describe`.

        >>> Accumulator(lanes=4)._lanes_text()
        ' in each of 4 interleaved lanes (product k in lane k mod 4), lanes combined sequentially'
        """
        txt = ""
        if self.lanes is not None:
            comb = self.lane_combine
            how = (
                {
                    "sequential": "sequentially",
                    "pairwise": "pairwise",
                    "halving": "by halving",
                }[comb]
                if isinstance(comb, str)
                else f"as {comb}"
            )
            u = self.lane_unroll or self.lanes
            txt += (
                f" over the first K - K mod {u} products (one lane)"
                if self.lanes == 1
                else f" in each of {self.lanes} interleaved lanes (product k in lane k mod "
                f"{self.lanes}), lanes combined {how}"
                if self.lane_run is None
                else f" in each of {self.lanes} lanes fed by runs of {self.lane_run} products "
                f"(product k in lane (k // {self.lane_run}) mod {self.lanes}, each run summed "
                f"first), lanes combined {how}"
            )
            if self.lane_vector is not None:
                u = self.lane_vector
                txt += (
                    f", then whole vectors of {u} into lanes 0..{u - 1} (one by one after "
                    "each lane's own)"
                )
            txt += {
                "lanes": "",
                "after": f", the last K mod {u} products added after them",
                "first": f", the last K mod {u} products added to lane 0",
                "separate": f", the last K mod {u} products summed apart"
                + (
                    f" in {self.tail_format}"
                    + (
                        f" (products rounded to {self.tail_product_format})"
                        if self.tail_product_format is not None
                        else ""
                    )
                    + f", the lanes' value added in {self.tail_format}, then rounded to "
                    f"{self.format}"
                    if self.tail_format is not None
                    else " and added after them"
                ),
                "separate_first": f", the last K mod {u} products summed apart and added to "
                + (f"the lanes = 0 mod {u}" if self.lane_vector else "lane 0")
                + " before the lanes are combined",
            }[self.lane_tail]
            if self.small_k is not None:
                txt += f", no lanes below K = {self.small_k}"
        if self.split_k is not None:
            bal = (
                ""
                if self.split_balance is None
                else f" (a rest under {2 * self.split_k} halved, "
                + ("rounded down, " if self.split_half == "floor" else "")
                + f"then up to a multiple of {self.split_balance})"
            )
            if self.split_equal is not None:
                bal = f" (or equal blocks, multiples of {self.split_equal}, where they fit)"
            txt += {
                "sequential": f", K split into blocks of {self.split_k}{bal} added in turn",
                "pairwise": f", K split into blocks of {self.split_k} combined pairwise",
                "halving": f", K halved recursively down to {self.split_k} products",
            }[self.split_combine]
        return txt

    def _special_rules(self) -> str:
        """The non-default special-value rules, as a suffix of :meth:`describe`.

        >>> Accumulator(overflow="infinity", zero_sign="positive")._special_rules()
        '; overflow gives ±inf in every rounding mode, zero results are +0'
        """
        rules = []
        if self.overflow == "infinity":
            rules.append("overflow gives ±inf in every rounding mode")
        elif self.overflow == "saturate":
            rules.append("overflow saturates to ±max")
        if self.zeros_in_anchor:
            rules.append(f"zeros align with exponent {self.zero_exponent}")
        if self.zero_sign == "positive":
            rules.append("zero results are +0")
        if self.k1_product:
            rules.append("K = 1 gives the product itself")
        if self.nan_encoding == "nvidia":
            rules.append("NaN is 0x7fffffff")
        if self.subnormals == "flush":
            rules.append(
                "subnormal results flushed to zero"
                + (" (tininess after rounding)" if self.tininess == "after_rounding" else "")
            )
        return "; " + ", ".join(rules) if rules else ""


def reference_only(acc: Accumulator) -> str | None:
    """Why the general kernels (CuPy's, the native per-element ones) do not compute ``acc``
    (None: every backend does): only Kahan summation (``order="compensated"``), a C type
    apart from the output's (``c_format``), a lane tail in its own format (``tail_format``),
    lanes fed by runs of products (``lane_run``),
    the CPU instructions' rules of spec 3c/3d
    (``input_subnormals="flush_signed"``, ``pair_order="odd_first"``,
    ``tininess="after_rounding"``) and ``k1_product`` with a stochastic ``rounding`` (spec
    3f) are the numpy reference's alone. Every other model is the general kernels'
    (``pl_gemm.cuh``), CPU lanes and split-K (spec 3e) and ``k1_product`` included:
    block-scaled MMA (``scales="in_block"``, with or without groups), ``addend="separate"``,
    ``order="exact_block"``, ``input_subnormals="flush"`` (the inputs flushed first, then the
    model with them kept) and fp64 inputs; the native backend also has fast kernels for them
    (``native_backend.gemm_block_scaled``, ``gemm_separate``, ``gemm_exact_block``,
    ``gemm_fma64``).

    >>> reference_only(Accumulator(order="compensated"))
    "order='compensated'"
    """
    if acc.order == "compensated":
        return f"order={acc.order!r}"
    if acc.c_format is not None:
        return f"c_format={str(acc.c_format)!r}"
    if acc.tail_format is not None:
        return f"tail_format={str(acc.tail_format)!r}"
    for name in ("input_subnormals", "pair_order", "tininess"):  # (spec 3c, 3d)
        value = getattr(acc, name)
        if value in (
            "flush_signed",
            "flush_signed_c",
            "flush_signed_fp16",
            "odd_first",
            "after_rounding",
        ):
            return f"{name}={value!r}"
    if acc.k1_product and is_stochastic(check_rounding(acc.rounding)):
        return f"k1_product=True with rounding={acc.rounding!r}"
    if acc.lane_run is not None:
        return f"lane_run={acc.lane_run}"
    return None
