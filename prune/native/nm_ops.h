// N:M-sparse kernels of prune.SparseDense (issue 36), included by sparse_ops.cc inside its anonymous
// namespace (it provides vec, kLanes, Scratch, Parallel, Shared, kTiledSerial, kTiledShared).
//
// A structure is N:M when, for every output j and every group g of m consecutive inputs (rows
// [g m, g m + m) of W, axis -2 of the kernel as prune.NByM prunes it; the last group is partial when m
// does not divide n_in), at most n entries are stored. (prune.NByM(z, m) prunes z of every m: NByM(2, 4)
// leaves 2:4, NByM(3, 4) 1:4, NByM(4, 8) 4:8.) prune.native.structure appends an N:M section when the
// padded slots are at least 90% filled (NM_MIN_FILL) and no block section applies, for (n, m) in
// (2, 4), (1, 4), (4, 8), (2, 8), (1, 8); a panel section may follow it:
//
//   [ kNmMagic | n | m | groups | codes (slots / 4) | slots (slots) ],  slots = blocks * groups * n * 64
//
// for blocks = ceil(n_out / 64). Slot t = ((J groups + g) n + s) 64 + l is the s-th entry of output
// j = 64 J + l among the inputs of group g: codes (one byte per slot, four to an int32 in the machine's
// byte order) holds its input's offset in the group (input g m + code), slots its position in `values`,
// or -1 for a padding slot (value 0, code 0; also every slot of the outputs past n_out). Block by block,
// so that each block's codes and slots are one contiguous stretch.
//
// Forward (y = x @ W; the op takes this path from batch 2 until the panel kernel takes over): output
// units in the vector lanes. A unit of work is one block of 64 outputs: it checks every slot (in
// [-1, nnz)) and code (below m; below the inputs of the last group in its rows) of the block, then
// gathers the block's values into slot order in its thread's buffer (AVX-512 masked gathers; the reads
// walk the m rows of W of one group), and only then multiplies: for R = 4 batch rows at once, per group
// g the m inputs x[b, g m : g m + m] are broadcast into one register per row (m = 4: one 128-bit lane
// replicated), and per slot s and output vector k a permute picks each lane's input by its code
// (VPERMILPS within 128-bit lanes for m = 4, VPERMPS across the register for m = 8; AVX2 the same on
// 8 lanes; 4-lane builds pick with scalar loads) before one FMA with the slot's values: R x K = 4 x 4
// vector accumulators, no column loads, no row pointers, n and m compile-time. A corrupt block gives
// InvalidArgument before any of its products (blocks already done may have written y, which the op then
// does not return). Measurements: the header of sparse_ops.cc.
//
// Values gradient (dv[k] = sum_b x[b, i_k] dy[b, j_k], NmValuesGrad): the same lanes and picks, the batch as the
// reduction: per block of outputs (its codes and slots checked first), per pass of kNmGradRows batch rows and per
// group, the n x K slot vectors accumulate pick(x[b, group], codes) * dy[b, outputs] over the pass's rows, their
// codes held in registers, then each lane is added to its slot's position in dv. The input gradient runs the general kernels (the
// structure's CSR of W).

constexpr int32_t kNmMagic = 0x4d4e3a31;  // "1:NM"
constexpr int64_t kNmWidth = 64;          // outputs per block of the section
static_assert(kNmWidth % (4 * kLanes) == 0, "kNmWidth must be a multiple of 4 vectors");

struct NmSection {
  int64_t n = 0, m = 0, groups = 0, blocks = 0;  // n = 0: no N:M section
  const uint8_t* codes = nullptr;                 // [blocks * groups * n * kNmWidth]
  const int32_t* slots = nullptr;                 // [blocks * groups * n * kNmWidth]
  int64_t Slots() const { return blocks * groups * n * kNmWidth; }
};

inline bool NmShapeOk(int64_t n, int64_t m) {
  return (m == 4 && (n == 1 || n == 2)) || (m == 8 && (n == 1 || n == 2 || n == 4));
}

// Reads an N:M section at s (len entries left) into *nm and its length into *used; checks its header and length
// (codes and slots are checked by the value gather of every call, NmGather).
Status UnpackNm(const int32_t* s, int64_t len, int64_t n_in, int64_t n_out, NmSection* nm, int64_t* used) {
  if (len < 4 || s[0] != kNmMagic) return errors::InvalidArgument("structure has a malformed N:M section");
  const int64_t n = s[1], m = s[2], groups = s[3];
  if (!NmShapeOk(n, m)) return errors::InvalidArgument("structure's N:M section has an unsupported shape ", n, ":", m);
  if (n_in < 1 || groups != (n_in + m - 1) / m)
    return errors::InvalidArgument("structure's N:M section has ", groups, " groups of ", m, " for ", n_in, " inputs");
  nm->n = n;
  nm->m = m;
  nm->groups = groups;
  nm->blocks = (n_out + kNmWidth - 1) / kNmWidth;
  const int64_t slots = nm->Slots(), size = 4 + slots / 4 + slots;
  if (size > len) return errors::InvalidArgument("structure's N:M section is cut short (", len, " of ", size, " entries)");
  nm->codes = reinterpret_cast<const uint8_t*>(s + 4);
  nm->slots = s + 4 + slots / 4;
  *used = size;
  return OkStatus();
}

// dst[t] = values[slots[t]] (0 for a padding slot, -1) for the section's rows [r0, r1) of kNmWidth slots (row
// (J groups + g) n + s), dst holding row r0 first. Every slot is checked to lie in [-1, nnz), every code below m
// (below the inputs of the last group, in its rows), before the values are read; returns false on a bad one
// (dst then incomplete). dst == nullptr: the checks alone. The values are read from the m rows of W of one group at a time (m streams).
inline bool NmGather(const NmSection& nm, int64_t n_in, const float* __restrict values, int64_t nnz, int64_t r0,
                     int64_t r1, float* __restrict dst) {
  const int64_t n = nm.n, m = nm.m, groups = nm.groups;
  const int64_t last = n_in - (groups - 1) * m;  // inputs of the last group
  const uint32_t lim = static_cast<uint32_t>(nnz) + 1u;
  for (int64_t r = r0; r < r1; ++r) {
    const int32_t* __restrict sl = nm.slots + r * kNmWidth;
    const uint8_t* __restrict co = nm.codes + r * kNmWidth;
    const uint32_t code_lim = static_cast<uint32_t>((r / n) % groups == groups - 1 ? last : m);
    uint32_t hi = 0, chi = 0;
    for (int64_t l = 0; l < kNmWidth; ++l) {  // vectorised max reductions
      hi = std::max(hi, static_cast<uint32_t>(sl[l]) + 1u);  // -1 (padding) -> 0
      chi = std::max(chi, static_cast<uint32_t>(co[l]));
    }
    if (hi >= lim || chi >= code_lim) return false;
    if (dst == nullptr) continue;  // the check alone
#if defined(__AVX512F__)
    for (int64_t l = 0; l < kNmWidth; l += 16) {
      const __m512i p = _mm512_loadu_si512(sl + l);
      const __mmask16 keep = _mm512_cmpge_epi32_mask(p, _mm512_setzero_si512());
      _mm512_storeu_ps(dst + (r - r0) * kNmWidth + l, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), keep, p, values, 4));
    }
#else
    for (int64_t l = 0; l < kNmWidth; ++l) dst[(r - r0) * kNmWidth + l] = sl[l] >= 0 ? values[sl[l]] : 0.0f;
#endif
  }
  return true;
}

// The m inputs of a group, in the form NmPick selects from.
#if defined(__AVX512F__) && !defined(PRUNE_VEC_BYTES)
#define PRUNE_NM_PERM 16
template <int M>
inline __m512 NmLoad(const float* p) {
  if (M == 4) return _mm512_broadcast_f32x4(_mm_loadu_ps(p));
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
}
// The lane codes, widened once per vector of outputs and shared by the R rows.
inline __m512i NmIdx(const uint8_t* c) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c))); }
// m = 4: the group replicated in every 128-bit lane, so an in-lane VPERMILPS picks (on Zen 4 a lane-crossing
// VPERMPS zmm bounded the loop at about 2 cycles per FMA); m = 8: VPERMPS.
template <int M>
inline vec NmPick(__m512 xq, __m512i idx) {
  if (M == 4) return (vec)_mm512_permutevar_ps(xq, idx);
  return (vec)_mm512_permutexvar_ps(idx, xq);
}
using NmX = __m512;
#elif defined(PRUNE_AVX2) && !defined(PRUNE_VEC_BYTES) && !defined(__AVX512F__)
#define PRUNE_NM_PERM 8
template <int M>
inline __m256 NmLoad(const float* p) {
  if (M == 4) return _mm256_broadcast_ps(reinterpret_cast<const __m128*>(p));
  return _mm256_loadu_ps(p);
}
inline __m256i NmIdx(const uint8_t* c) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c))); }
template <int M>
inline vec NmPick(__m256 xq, __m256i idx) {
  if (M == 4) return (vec)_mm256_permutevar_ps(xq, idx);
  return (vec)_mm256_permutevar8x32_ps(xq, idx);
}
using NmX = __m256;
#else
template <int M>
inline const float* NmLoad(const float* p) { return p; }
inline const uint8_t* NmIdx(const uint8_t* c) { return c; }
template <int M>
inline vec NmPick(const float* xq, const uint8_t* c) {
  vec r;
  for (int l = 0; l < kLanes; ++l) r[l] = xq[c[l]];
  return r;
}
using NmX = const float*;
#endif

// acc[r][k] += sum over groups [0, ng) and slots of vals * x_r[g m + code], for R rows whose group g starts at
// xr[r] + g * M (vals, codes: [ng][N][kNmWidth], of which the (K * kLanes) lanes from the pointers are read).
template <int N, int M, int R, int K>
inline void NmGroups(const float* const* xr, int64_t ng, const float* vals, const uint8_t* codes, vec (*acc)[K]) {
  for (int64_t g = 0; g < ng; ++g) {
    NmX xq[R];
    for (int r = 0; r < R; ++r) xq[r] = NmLoad<M>(xr[r] + g * M);
    for (int s = 0; s < N; ++s) {
      const float* v = vals + (g * N + s) * kNmWidth;
      const uint8_t* c = codes + (g * N + s) * kNmWidth;
      for (int k = 0; k < K; ++k) {
        vec vk = *reinterpret_cast<const vec*>(v + k * kLanes);
#if defined(PRUNE_NM_PERM)  // machine-width vectors (a wider vec has no register for "v")
        // In a register: folded into each of the R FMAs as a memory operand, it was loaded R times (one load
        // per FMA, the loads then the bound).
        asm("" : "+v"(vk));
#endif
        const auto idx = NmIdx(c + k * kLanes);
        for (int r = 0; r < R; ++r) acc[r][k] += NmPick<M>(xq[r], idx) * vk;
      }
    }
  }
}

// y[b, j0 : j0 + w] for R rows from b: one output block jb (values and codes gathered by NmGather).
template <int N, int M, int R, int K>
void NmRows(const float* x, int64_t b, int64_t n_in, int64_t n_out, int64_t groups, const float* vals,
            const uint8_t* codes, int64_t j0, int64_t w, float* y) {
  vec acc[R][K];
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < K; ++k) acc[r][k] = vec{};
  const int64_t full = n_in / M;  // groups whose m inputs are all in x's row
  const float* xr[R];
  for (int r = 0; r < R; ++r) xr[r] = x + (b + r) * n_in;
  NmGroups<N, M, R, K>(xr, full, vals, codes, acc);
  if (full < groups) {  // the last group, partial: its inputs copied, zero-padded
    alignas(64) float tail[R][8];
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < 8; ++c) tail[r][c] = full * M + c < n_in && c < M ? xr[r][full * M + c] : 0.0f;
      xr[r] = tail[r];
    }
    NmGroups<N, M, R, K>(xr, 1, vals + full * N * kNmWidth, codes + full * N * kNmWidth, acc);
  }
  for (int r = 0; r < R; ++r) {
    float* out = y + (b + r) * n_out + j0;
    if (w == (K * kLanes)) {
      for (int k = 0; k < K; ++k) std::memcpy(out + k * kLanes, &acc[r][k], sizeof(vec));
    } else {
      alignas(64) float tmp[(K * kLanes)];
      for (int k = 0; k < K; ++k) std::memcpy(tmp + k * kLanes, &acc[r][k], sizeof(vec));
      std::memcpy(out, tmp, sizeof(float) * w);
    }
  }
}


// Units of work: the section's blocks of kNmWidth outputs. Each gathers (and checks) its block's values into its
// thread's buffer (64 KB at 2:4 and 512 inputs: L2), then runs every batch row, R at a time, over each of its
// kNmWidth / (K kLanes) sub-blocks. x is re-read once per block, from L2 or L3.
template <int N, int M, int R, int K>
void NmForwardT(OpKernelContext* ctx, const float* x, int64_t batch, int64_t n_in, int64_t n_out, const NmSection& nm,
                const float* values, int64_t nnz, float* y, std::atomic<bool>* bad, bool gather_only) {
  constexpr int64_t subs = kNmWidth / (K * kLanes);
  const int64_t groups = nm.groups, rows = groups * N;  // section rows per block
  auto unit = [&](int64_t J) {
    float* gv = Scratch(2, rows * kNmWidth);
    if (!NmGather(nm, n_in, values, nnz, J * rows, (J + 1) * rows, gv)) {
      *bad = true;
      return;
    }
    if (gather_only) return;
    const uint8_t* codes = nm.codes + J * rows * kNmWidth;
    int64_t b = 0;
    auto pass = [&](auto rr) {
      constexpr int RR = decltype(rr)::value;
      for (int64_t sub = 0; sub < subs; ++sub) {
        const int64_t j0 = J * kNmWidth + sub * K * kLanes, w = std::min<int64_t>(K * kLanes, n_out - j0);
        if (w > 0) NmRows<N, M, RR, K>(x, b, n_in, n_out, groups, gv + sub * K * kLanes, codes + sub * K * kLanes, j0, w, y);
      }
      b += RR;
    };
    while (b + R <= batch) pass(std::integral_constant<int, R>());
    while (b + 4 <= batch) pass(std::integral_constant<int, 4>());
    switch (batch - b) {
      case 3: pass(std::integral_constant<int, 3>()); break;
      case 2: pass(std::integral_constant<int, 2>()); break;
      case 1: pass(std::integral_constant<int, 1>()); break;
      default: break;
    }
  };
  const int64_t units = nm.blocks, macs = batch * groups * N * n_out;
  if (macs < kTiledSerial || units == 1) {
    for (int64_t u = 0; u < units; ++u) unit(u);
  } else if (macs < kTiledShared) {
    Shared(ctx, units, unit);
  } else {
    Parallel(ctx, units, unit);
  }
}

// y = x @ W on an N:M section. Returns false (y unwritten) when the section holds an out-of-range code or slot.
bool NmForward(OpKernelContext* ctx, const float* x, int64_t batch, const NmSection& nm, int64_t n_in, int64_t n_out,
               const float* values, int64_t nnz, float* y, bool gather_only, int variant = 0) {
  std::atomic<bool> bad{false};
  const int64_t n = nm.n, m = nm.m;
#define PRUNE_NM_RUN(R, K)                                                                             \
  if (m == 4 && n == 1) NmForwardT<1, 4, R, K>(ctx, x, batch, n_in, n_out, nm, values, nnz, y, &bad, gather_only); \
  else if (m == 4) NmForwardT<2, 4, R, K>(ctx, x, batch, n_in, n_out, nm, values, nnz, y, &bad, gather_only);      \
  else if (n == 1) NmForwardT<1, 8, R, K>(ctx, x, batch, n_in, n_out, nm, values, nnz, y, &bad, gather_only);      \
  else if (n == 2) NmForwardT<2, 8, R, K>(ctx, x, batch, n_in, n_out, nm, values, nnz, y, &bad, gather_only);      \
  else NmForwardT<4, 8, R, K>(ctx, x, batch, n_in, n_out, nm, values, nnz, y, &bad, gather_only);
  if (variant == 1) { PRUNE_NM_RUN(8, 2) }
  else if (variant == 2) { PRUNE_NM_RUN(4, 2) }
  else { PRUNE_NM_RUN(4, 4) }
#undef PRUNE_NM_RUN
  return !bad;
}

// Batch rows per pass of the values gradient over a block's groups: the rows' part of x ([kNmGradRows, n_in], 128 KB
// at 512 inputs) stays in L2 and of dy ([kNmGradRows, 64 outputs], 16 KB) in L1 while every group of the block reads
// them. Reading all the rows per group instead streamed x and dy from memory once per group: 168 ms against dense
// x^T dy's 41 ms at 4096 rows, 512x2048, 2:4 (Zen 4, 2 threads, quiet), where 256 rows took 4.0 ms against 3.2.
constexpr int64_t kNmGradRows = 64;

// dv for the slots of block J, group g, output vectors [j0, j0 + K kLanes) (w of them below n_out): the reduction over
// the batch rows [b0, b1), then each lane added to its slot's position (checked by NmGather before; dv starts at 0).
template <int N, int M, int K>
void NmGradGroup(const float* x, const float* dy, int64_t b0, int64_t b1, int64_t n_in, int64_t n_out,
                 const NmSection& nm, int64_t J, int64_t g, int64_t sub, float* dv) {
  constexpr int64_t W = K * kLanes;
  const int64_t row0 = (J * nm.groups + g) * N;  // the section's row of slot 0
  const int64_t j0 = J * kNmWidth + sub * W, w = std::min<int64_t>(W, n_out - j0);
  if (w <= 0) return;
  using Idx = decltype(NmIdx(nm.codes));
  Idx idx[N][K];
  for (int s = 0; s < N; ++s)
    for (int k = 0; k < K; ++k) idx[s][k] = NmIdx(nm.codes + (row0 + s) * kNmWidth + sub * W + k * kLanes);
  vec acc[N][K];
  for (int s = 0; s < N; ++s)
    for (int k = 0; k < K; ++k) acc[s][k] = vec{};
  const bool whole = g * M + M <= n_in;  // else the last group, partial: its inputs copied, zero-padded
  alignas(64) float xt[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  alignas(64) float dyt[W];
  for (int64_t b = b0; b < b1; ++b) {
    const float* xg = x + b * n_in + g * M;
    if (!whole) {
      for (int c = 0; c < M; ++c) xt[c] = g * M + c < n_in ? xg[c] : 0.0f;
      xg = xt;
    }
    const float* d = dy + b * n_out + j0;
    if (w < W) {
      for (int64_t l = 0; l < W; ++l) dyt[l] = l < w ? d[l] : 0.0f;
      d = dyt;
    }
    const auto xq = NmLoad<M>(xg);
    for (int k = 0; k < K; ++k) {
      vec dk;
      std::memcpy(&dk, d + k * kLanes, sizeof(vec));
      for (int s = 0; s < N; ++s) acc[s][k] += NmPick<M>(xq, idx[s][k]) * dk;
    }
  }
  for (int s = 0; s < N; ++s) {
    alignas(64) float out[W];
    for (int k = 0; k < K; ++k) std::memcpy(out + k * kLanes, &acc[s][k], sizeof(vec));
    const int32_t* sl = nm.slots + (row0 + s) * kNmWidth + sub * W;
    for (int64_t l = 0; l < w; ++l)
      if (sl[l] >= 0) dv[sl[l]] += out[l];
  }
}

// The values gradient on an N:M section; units: blocks of 64 outputs. Returns false (dv incomplete) on an
// out-of-range code or slot.
template <int N, int M>
bool NmValuesGradT(OpKernelContext* ctx, const float* x, const float* dy, int64_t batch, int64_t n_in, int64_t n_out,
                   const NmSection& nm, int64_t nnz, float* dv) {
  constexpr int K = 4;
  constexpr int64_t subs = kNmWidth / (K * kLanes);
  std::atomic<bool> bad{false};
  const int64_t rows = nm.groups * N;
  auto unit = [&](int64_t J) {
    if (!NmGather(nm, n_in, nullptr, nnz, J * rows, (J + 1) * rows, nullptr)) {
      bad = true;
      return;
    }
    for (int64_t b0 = 0; b0 < batch; b0 += kNmGradRows) {
      const int64_t b1 = std::min(batch, b0 + kNmGradRows);
      for (int64_t g = 0; g < nm.groups; ++g)
        for (int64_t sub = 0; sub < subs; ++sub) NmGradGroup<N, M, K>(x, dy, b0, b1, n_in, n_out, nm, J, g, sub, dv);
    }
  };
  const int64_t units = nm.blocks, macs = batch * nm.groups * N * n_out;
  if (macs < kTiledSerial || units == 1) {
    for (int64_t u = 0; u < units; ++u) unit(u);
  } else if (macs < kTiledShared) {
    Shared(ctx, units, unit);
  } else {
    Parallel(ctx, units, unit);
  }
  return !bad;
}

bool NmValuesGrad(OpKernelContext* ctx, const float* x, const float* dy, int64_t batch, int64_t n_in, int64_t n_out,
                  const NmSection& nm, int64_t nnz, float* dv) {
  std::memset(dv, 0, sizeof(float) * nnz);  // a slot-less entry (a structure that is not N:M after all) stays 0
  const int64_t n = nm.n, m = nm.m;
  if (m == 4 && n == 1) return NmValuesGradT<1, 4>(ctx, x, dy, batch, n_in, n_out, nm, nnz, dv);
  if (m == 4) return NmValuesGradT<2, 4>(ctx, x, dy, batch, n_in, n_out, nm, nnz, dv);
  if (n == 1) return NmValuesGradT<1, 8>(ctx, x, dy, batch, n_in, n_out, nm, nnz, dv);
  if (n == 2) return NmValuesGradT<2, 8>(ctx, x, dy, batch, n_in, n_out, nm, nnz, dv);
  return NmValuesGradT<4, 8>(ctx, x, dy, batch, n_in, n_out, nm, nnz, dv);
}
