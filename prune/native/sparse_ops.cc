// Native sparse kernels for prune.SparseDense and prune.SparseConv2D (float32, CPU).
//
// The weight W [n_in, n_out] is given by its trainable `values` [nnz] in
// row-major order of W and an int32 `structure` vector kept beside them by the
// layer (rebuilt only when the structure changes):
//
//   structure = [ rp (n_in + 1) | cols (nnz) | trp (n_out + 1) | tcols (nnz) | tperm (nnz) ]
//
// rp/cols: CSR of W (row pointers, column of each stored entry); trp/tcols:
// CSR of W^T (rows = output units); tperm[k]: the position in `values` of the
// k-th entry of W^T.
//
//   PruneSpmm(x, values, structure; n_in, n_out, transpose, profile)
//       transpose = false: y = x @ W    (x [batch, n_in],  y [batch, n_out])
//       transpose = true:  y = x @ W^T  (x [batch, n_out], y [batch, n_in]), the input gradient
//       profile (benchmark only, benchmarks/csr_overhead.py; 0 = normal): 1 returns after
//       the checks and the output allocation, y unwritten (forward with more tiles than threads
//       checks in its value gather, after this); 2 (forward, more tiles than
//       threads) returns after gathering the values into W^T order; 3 skips the
//       multiply-adds of the tiled paths (transposes and write-back only, y garbage); 4
//       ignores a block section (the general kernels on a blocked structure); 5 runs batch 1
//       forward as a row gather over W^T through tperm (AVX-512 gathers), the layout scipy's
//       product walks: 105k/48k/9.8k cycles per op at 90/95/99% on Zen 4 against the
//       scatter's 67k/34k/8.9k, so the scatter stays; 6 ignores a panel section (the tiled
//       kernel over W^T after the value gather, as before panels); 7 ignores an N:M section
//       (the general kernels on an N:M structure); 8 / 9 run the N:M kernel with 8 batch rows x
//       2 output vectors / 4 x 2 per pass instead of 4 x 4 (the design's alternatives, nm_ops.h);
//       2 on the N:M path returns after its value gathers.
//   PruneSddmm(x, dy, values, structure; n_in, n_out, profile)
//       dv[k] = sum_b x[b, i_k] * dy[b, j_k] for the k-th stored entry (i_k, j_k):
//       the values gradient (a sampled dense-dense product), no [nnz, batch] temporary.
//       profile (benchmark only): 7 ignores an N:M section (the general kernel).
//   PruneConv2d(x, values, structure; n_in, n_out, kernel_size, strides, dilations, padding)
//       y = conv2d(x, kernel) for an NHWC x and the kernel's patch matrix W [kh * kw * C, n_out]
//       (prune.SparseConv2D): the forward tiles over output positions, each tile's patches formed
//       in cache (implicit im2col; see the section at the end of the file).
//   PruneCol2im(dp, x; kernel_size, strides, dilations, padding)
//       dx = the sum into each pixel of x of the patch gradients dp that read it: PruneConv2d's
//       input gradient after dp = dy @ W^T (PruneSpmm, transpose).
//
// Batches of at least one machine vector (4 rows with SSE2 or NEON, 8 with AVX,
// 16 with AVX-512) go through tiles of up to 4 vectors of batch rows: the tile of x is
// transposed into a [n_features, tile] buffer that stays in cache and each
// output row accumulates value * buffer[col] with vector FMAs, two entries
// at a time. The input gradient walks W as stored. The forward pass walks
// W^T, whose values are not stored in its order: with at most one batch tile
// per thread (batch <= 64 on 2 threads) each tile reads values[tperm[k]] as
// it goes; with more tiles the values are first gathered into W^T order once
// (in parallel, into a per-thread buffer kept across calls) so that the tiles
// do not repeat the indirect reads.
//
// Smaller batches (B < one vector) transpose nothing: the forward pass
// scatters along W's rows (values read in stored order, no tperm) into a
// partial output per unit of work, summed at the end, skipping input
// features that are zero in every batch row; the input gradient computes one
// dot product per output row and batch row along W's rows, with independent
// accumulators (at batch 1 with AVX2: 8-entry vector gathers of x). Measured
// on AVX2 (2 threads): reading values through tperm at batch 1 costs 2-3x the
// scatter, as the indirect reads miss L2.
//
// A structure of whole 1 x C tiles along the output axis carries a block section after
// these parts; the ops then run the block kernels of block_ops.h (see there). A layer dense
// enough carries a panel section after that (kPanelMagic, below): W^T's entries ordered by
// panel of 128 inputs, then by output, which the forward op's batch tiles read when they
// outnumber the threads (PanelTile), so that each panel's part of the transposed input tile
// stays in L1 while its entries are added.
//
// An N:M structure (prune.NByM: at most n stored entries of every output in every group of m
// consecutive inputs; 2:4, 1:4, 4:8, 2:8, 1:8) whose padded slots are at least 90% filled carries an
// N:M section (kNmMagic, nm_ops.h; no block section then, and a panel section may follow): per
// block of 64 outputs, group and slot, each output's input code (one byte) and value position.
// The forward op runs the N:M kernel on it from batch 2 until the panel kernel takes over (more
// panel tiles than threads): output units in the vector lanes, each block's values gathered (and
// every code and slot range-checked) by the unit that multiplies them, then per group the m
// inputs of 4 batch rows broadcast into registers and each output lane's input picked by its code
// with an in-register permute (VPERMILPS for m = 4, VPERMPS for m = 8 on AVX-512 and AVX2; scalar
// picks on 4-lane builds) before one FMA: 4 rows x 4 vectors of accumulators, no column loads, no
// row pointers, n and m compile-time. Measured (2 threads, interleaved medians, taken under load
// from other jobs: load average 3-4 on the 2 cores, so +-30%), 2:4 / 4:8 at 512x2048 and 2048x512:
// the N:M kernel against the general kernels (profile 7) and TF's tf.matmul on the dense W:
//   rows 4:   0.45-1.1 ms vs 0.81-1.3 (general) vs 0.36-0.71 (dense)
//   rows 16:  0.74-0.93     vs 0.94-1.34          vs 0.61-0.83
//   rows 64:  1.76-2.21     vs 2.04-2.56          vs 1.52-1.60
// one thread (process CPU time), 256 rows: N:M 5.7-6.1 ms, general with panels 4.1-5.6, dense 5.2-6.3;
// 2048 rows: 41-43, 28.4-29.5, 40.7-41.4. The permute + FMA pair costs about 2 cycles per 16
// multiply-adds on Zen 4 (VPERMILPS measured no faster than VPERMPS), so from 256 rows the panel
// kernel (buffer rows in L1, one load per FMA) wins and runs; at batch 1 the general scatter does
// (0.40-0.42 against 0.45-0.59 ms). The values gradient (PruneSddmm) has an N:M kernel too (the same
// lanes and picks, the batch rows as the reduction; nm_ops.h): 2 threads, 256 rows, 2:4 and 4:8 at
// 512x2048 and 2048x512: 5.5-6.1 ms against 10.0-10.9 for the general kernel and 6.1-7.7 for TF's
// dense x^T @ dy alone; 16 rows 0.91-1.05 against 2.8-6.6 and 0.92-1.17. The input gradient runs the
// general kernel over W's rows (2:4, 256 rows: 6.0-6.4 ms against 7.3-8.0 for dy @ W^T dense).
//
// Work runs on the op's intra-op thread pool. The small-batch paths cut the work into
// units of about 32k multiply-adds (kSmallUnit; a smaller op runs on the calling thread)
// that the calling thread and whichever pool threads wake in time take in turn (Shared),
// as do the tiled paths below 32M multiply-adds (kTiledShared).
// Every column and permutation entry a path reads is range-checked
// before the kernels run (CheckEntries, one vectorised pass per array per call;
// the kernels then index unchecked), so a corrupt structure gives
// InvalidArgument, never a wild read.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

// The AVX2 paths (register transposes, 8-wide gathers) need FMA as well.
#if defined(__AVX2__) && defined(__FMA__)
#define PRUNE_AVX2 1
#include <immintrin.h>
#endif

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

using namespace tensorflow;  // NOLINT
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

namespace {

// One machine vector of floats. GCC lowers a vector type wider than the
// machine's through memory (a 64-byte type without AVX-512 measured 15x
// slower on AVX2), so the width follows the instruction set the library is
// compiled for: 16 lanes with AVX-512, 8 with AVX, else 4 (SSE2, the x86-64
// baseline; NEON on aarch64). PRUNE_VEC_BYTES overrides it (tests build the
// 4-lane path on x86-64 to run the code that aarch64 compiles).
#if defined(PRUNE_VEC_BYTES)
constexpr int kVecBytes = PRUNE_VEC_BYTES;
#elif defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif
static_assert(kVecBytes == 16 || kVecBytes == 32 || kVecBytes == 64, "PRUNE_VEC_BYTES must be 16, 32 or 64");
constexpr int kLanes = kVecBytes / 4;
typedef float vec __attribute__((vector_size(kVecBytes)));

#if defined(__AVX512F__)
#define PRUNE_ISA "avx512"
#elif defined(PRUNE_AVX2)
#define PRUNE_ISA "avx2+fma"
#elif defined(__AVX__)
#define PRUNE_ISA "avx"
#elif defined(__ARM_NEON)
#define PRUNE_ISA "neon"
#elif defined(__SSE2__)
#define PRUNE_ISA "sse2"
#else
#define PRUNE_ISA "generic"
#endif

// Per-thread scratch, grown on demand and reused across calls.
float* Scratch(int which, size_t n) {
  thread_local float* bufs[4] = {nullptr, nullptr, nullptr, nullptr};
  thread_local size_t caps[4] = {0, 0, 0, 0};
  if (caps[which] < n) {
    std::free(bufs[which]);
    bufs[which] = static_cast<float*>(std::aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64));
    caps[which] = n;
  }
  return bufs[which];
}

int NumThreads(OpKernelContext* ctx) {
  return std::max(1, ctx->device()->tensorflow_cpu_worker_threads()->num_threads);
}

// fn(u) for u in [0, units), on the op's intra-op pool.
void Parallel(OpKernelContext* ctx, int64_t units, const std::function<void(int64_t)>& fn) {
  if (units <= 1) {
    if (units == 1) fn(0);
    return;
  }
  ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
      units, tsl::thread::ThreadPool::SchedulingParams::Fixed(1), [&](int64_t u0, int64_t u1) {
        for (int64_t u = u0; u < u1; ++u) fn(u);
      });
}

// fn(u) for u in [0, units): the calling thread takes units in order from a shared counter,
// and up to NumThreads - 1 threads of the op's pool take units from the same counter when
// they wake in time. The caller never waits for a thread to wake: a helper that starts
// after the last unit was taken runs nothing, and the caller waits only for units a helper
// is running. For ops of 10 us to a few ms (the small-batch paths; the tiled paths below
// kTiledShared multiply-adds): on this VM a
// pool thread started about 6-8 us after Schedule, but the Schedule call itself cost the
// caller 8-30 us (a futex wake of a sleeping thread), and ParallelFor, whose caller also
// sleeps until the last range is done, made 1024x1024 at batch 1 and 80% slower on two
// threads than on one (0.184 against 0.155 ms). Which thread runs a unit varies from call
// to call, so fn(u) must write only what unit u owns; results then do not depend on
// timing (nor on the number of threads where, as on the small-batch paths, the units are
// sized by the work alone).
struct SharedUnits {
  std::atomic<int64_t> next{0};
  std::atomic<int> inside{0};
  std::atomic<bool> closed{false};
};

void Shared(OpKernelContext* ctx, int64_t units, const std::function<void(int64_t)>& fn) {
  const int64_t helpers = std::min<int64_t>(NumThreads(ctx) - 1, units - 1);
  if (helpers <= 0) {
    for (int64_t u = 0; u < units; ++u) fn(u);
    return;
  }
  // The helpers' closures may outlive this call (a helper that wakes late): they hold the
  // state, and touch fn only while registered inside, which the caller waits out.
  auto state = std::make_shared<SharedUnits>();
  const std::function<void(int64_t)>* f = &fn;
  for (int64_t h = 0; h < helpers; ++h) {
    ctx->device()->tensorflow_cpu_worker_threads()->workers->Schedule([state, f, units] {
      // Registered before reading `closed` (both sequentially consistent), so either the
      // caller sees this helper inside and waits for it, or the helper sees `closed`.
      state->inside.fetch_add(1);
      if (!state->closed.load()) {
        for (int64_t u; (u = state->next.fetch_add(1)) < units;) (*f)(u);
      }
      state->inside.fetch_sub(1);
    });
  }
  for (int64_t u; (u = state->next.fetch_add(1)) < units;) fn(u);
  state->closed.store(true);
  while (state->inside.load() != 0) {  // at most the rest of the units the helpers hold
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
}

// Splits rows [0, n) into `units` ranges of about equal stored entries.
std::vector<int64_t> SplitRows(const int32_t* rp, int64_t n, int64_t units) {
  std::vector<int64_t> bounds(units + 1, n);
  bounds[0] = 0;
  const int64_t nnz = rp[n];
  for (int64_t u = 1; u < units; ++u) {
    const int64_t target = nnz * u / units;
    bounds[u] = std::max(bounds[u - 1], static_cast<int64_t>(std::lower_bound(rp, rp + n + 1, target) - rp));
    bounds[u] = std::min(bounds[u], n);
  }
  return bounds;
}

struct Csr {
  const int32_t* rp;    // [n_rows + 1]
  const int32_t* cols;  // [nnz]
  const int32_t* perm;  // [nnz] or nullptr: value of entry k is values[perm[k]]
  int64_t n_rows, n_cols;
};

struct Error {
  std::atomic<bool> bad{false};
};

#ifdef PRUNE_AVX2
// dst[j * dst_stride + i] = rows[i][j] for i, j < 8: a full 8x8 block in AVX2 registers, its rows anywhere.
inline void TransposeRows8(const float* const* rows, float* dst, int64_t dst_stride) {
  {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows[i]);
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
      r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
      r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
      r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    // r[0..3]: columns 0, 1, 2, 3 of rows 0-3 (low lane) and columns 4-7 (high lane); r[4..7] rows 4-7
    for (int j = 0; j < 4; ++j) {
      _mm256_storeu_ps(dst + j * dst_stride, _mm256_permute2f128_ps(r[j], r[j + 4], 0x20));
      _mm256_storeu_ps(dst + (j + 4) * dst_stride, _mm256_permute2f128_ps(r[j], r[j + 4], 0x31));
    }
  }
}
#endif

// dst[j * dst_stride + i] = src[i * src_stride + j] for i < rows, j < cols
// (rows, cols <= 8); a full 8x8 block in AVX2 registers, else element by element.
inline void Transpose8(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                       int64_t cols) {
#ifdef PRUNE_AVX2
  if (rows == 8 && cols == 8) {
    const float* r[8];
    for (int i = 0; i < 8; ++i) r[i] = src + i * src_stride;
    TransposeRows8(r, dst, dst_stride);
    return;
  }
#endif
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * dst_stride + i] = src[i * src_stride + j];
}

// The value of the k-th entry of m: vals[k], or vals[perm[k]] when kPerm (perm range-checked
// by the op before any kernel runs: CheckEntries).
template <bool kPerm>
inline float Value(const Csr& m, const float* vals, int64_t k) {
  return kPerm ? vals[static_cast<uint32_t>(m.perm[k])] : vals[k];
}

// Entries ahead at which the loops that read values through a permutation prefetch the value
// they will need: the reads land anywhere in `values` (6.7 MB at 4096x4096, 90%, beyond L2),
// where the hardware prefetchers cannot follow them. At 4096x4096, 90%, 2 threads,
// interleaved: the value gather of batch 256 took 4.35 ms without, 2.9 / 2.6 / 2.6 / 2.1 / 2.5
// ms with 64 / 128 / 256 / 512 / 1024 ahead (the op 17.9 against 15.2 ms at 256); the tiles
// of batch 32, which read through tperm, 5.42 against 4.74 ms (1024x1024: level, as the values
// fit in L2). Prefetching the input tile's rows instead did not help (15.5 against 15.2 ms).
constexpr int64_t kPrefetchAhead = 256;

// Transposes x[b0:b0+tb, c0:c1] into buf[c * W + q], zero for q >= tb. Eight rows of x at
// a time, each swept along its columns: eight sequential streams for the hardware
// prefetcher (columns outermost made W streams, 64 with AVX-512).
void TransposeTile(const float* x, int64_t b0, int64_t tb, int64_t n_cols, int64_t W, int64_t c0, int64_t c1,
                   float* buf) {
  // Sixteen rows of x per sweep, so that each 64-byte line of buf is written whole by two consecutive 8 x 8
  // blocks (eight rows per sweep wrote half lines, each line then fetched twice).
  for (int64_t q16 = 0; q16 < W; q16 += 16) {
    for (int64_t c = c0; c < c1; c += 8) {
      const int64_t cn = std::min<int64_t>(8, c1 - c);
      for (int64_t q0 = q16; q0 < std::min<int64_t>(W, q16 + 16); q0 += 8) {
        const int64_t qn = std::max<int64_t>(0, std::min<int64_t>(8, tb - q0)), qe = std::min<int64_t>(8, W - q0);
        if (qn > 0) Transpose8(x + (b0 + q0) * n_cols + c, n_cols, buf + c * W + q0, W, qn, cn);
        for (int64_t cc = 0; cc < cn; ++cc)
          for (int64_t q = qn; q < qe; ++q) buf[(c + cc) * W + q0 + q] = 0.0f;
      }
    }
  }
}

// a[q] (+ b[q]) += sum over entries [k, e) of value_k * buf[cols[k] * W + q lanes]: two entries at a time into
// the two accumulator sets, so that the FMAs do not chain. value_k is vals[k], or vals[perm[k]] when kPerm, then
// prefetched kPrefetchAhead entries ahead (never past entry `last`).
template <int NV, bool kPerm>
inline void AddEntries(const float* buf, const int32_t* cols, const int32_t* perm, const float* vals, int64_t k,
                       int64_t e, int64_t last, vec* a, vec* b) {
  constexpr int64_t W = NV * kLanes;
  auto value = [&](int64_t j) { return kPerm ? vals[static_cast<uint32_t>(perm[j])] : vals[j]; };
  for (; k + 1 < e; k += 2) {
    // A prefetch never faults, so its target needs no range check (perm is checked before use).
    if (kPerm) __builtin_prefetch(vals + static_cast<uint32_t>(perm[std::min(k + kPrefetchAhead, last)]));
    const float v0 = value(k), v1 = value(k + 1);
    const vec* p0 = reinterpret_cast<const vec*>(buf + static_cast<uint32_t>(cols[k]) * W);
    const vec* p1 = reinterpret_cast<const vec*>(buf + static_cast<uint32_t>(cols[k + 1]) * W);
    for (int q = 0; q < NV; ++q) { a[q] += v0 * p0[q]; b[q] += v1 * p1[q]; }
  }
  if (k < e) {
    const float v0 = value(k);
    const vec* p0 = reinterpret_cast<const vec*>(buf + static_cast<uint32_t>(cols[k]) * W);
    for (int q = 0; q < NV; ++q) a[q] += v0 * p0[q];
  }
}

// y[b0 + q, r] = ob[(r - rb) * W + q] for q < tb and output rows [rb, re) (at most 64, so ob stays in L1).
inline void StoreRows(const float* ob, int64_t W, int64_t rb, int64_t re, int64_t b0, int64_t tb, int64_t n_rows,
                      float* y) {
  for (int64_t q0 = 0; q0 < tb; q0 += 8)
    for (int64_t r = rb; r < re; r += 8)
      Transpose8(ob + (r - rb) * W + q0, W, y + (b0 + q0) * n_rows + r, n_rows, std::min<int64_t>(8, re - r),
                 std::min<int64_t>(8, tb - q0));
}

// fill(b0, tb, W, c0, c1, buf) writes buf[c * W + q] for columns c in [c0, c1) and q < W (zero for q >= tb): the
// transposed tile of the left operand's rows [b0, b0 + tb) that the tiled kernels read. nullptr: x's own rows
// (TransposeTile); the sparse convolution passes the patches of its output positions (PatchTile), so that its
// patch matrix exists one tile at a time, in cache, never whole.
using TileFill = std::function<void(int64_t, int64_t, int64_t, int64_t, int64_t, float*)>;

// The transposed tile of x's batch rows [b0, b0 + tb) for a tile of W rows: `shared` when the caller
// transposed it already (TiledGather, for several row ranges at once), else this thread's own buffer.
inline const float* TileBuffer(const float* x, int64_t b0, int64_t tb, int64_t n_cols, int64_t W, const float* shared,
                               const TileFill* fill) {
  if (shared != nullptr) return shared;
  float* own = Scratch(0, n_cols * W);
  if (fill != nullptr) (*fill)(b0, tb, W, 0, n_cols, own);
  else TransposeTile(x, b0, tb, n_cols, W, 0, n_cols, own);
  return own;
}

// Tile of NV vectors of batch rows [b0, b0 + tb), output rows [r0, r1):
// y[b, r] = sum_k vals[k] * x[b, cols[k]] over row r of the matrix. shared: x's tile
// already transposed (by TiledGather, for several row ranges at once), else nullptr; fill: as in TileBuffer.
template <int NV, bool kPerm>
void Tile(const float* x, int64_t b0, int64_t tb, const Csr& m, const float* vals, int64_t r0, int64_t r1, float* y,
          bool products, const float* shared, const TileFill* fill) {
  constexpr int64_t W = NV * kLanes;
  constexpr int64_t kRowBlock = 64;
  const int64_t n_cols = m.n_cols, n_rows = m.n_rows;
  const float* buf = TileBuffer(x, b0, tb, n_cols, W, shared, fill);
  float* obuf = Scratch(1, kRowBlock * W);
  const int64_t last = m.rp[m.n_rows] - 1;  // the last entry: prefetches never read perm past it
  for (int64_t rb = r0; rb < r1; rb += kRowBlock) {
    const int64_t re = std::min(r1, rb + kRowBlock);
    for (int64_t r = rb; r < re; ++r) {
      vec a[NV], b[NV];
      for (int q = 0; q < NV; ++q) a[q] = b[q] = vec{};
      const int64_t k = m.rp[r], e = products ? m.rp[r + 1] : k;  // !products: the transposes alone (profile 3)
      AddEntries<NV, kPerm>(buf, m.cols, m.perm, vals, k, e, last, a, b);
      vec* o = reinterpret_cast<vec*>(obuf + (r - rb) * W);
      for (int q = 0; q < NV; ++q) o[q] = a[q] + b[q];
    }
    StoreRows(obuf, W, rb, re, b0, tb, n_rows, y);
  }
}

// Vectors of batch rows per tile: 4 (measured best of 1..8 at 1024x1024 and
// 4096x4096 on AVX2) while the transposed tile fits in half of L2 (as the OS
// reports it, else 256 KB; 1 MB L2 gives 4096 inputs two AVX-512 vectors), and
// no wider than the batch.
int64_t HalfL2() {
  static const int64_t half = [] {
    long l2 = 0;
#ifdef _SC_LEVEL2_CACHE_SIZE
    l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);  // glibc; 0 or -1 where unknown
#endif
    return l2 > 0 ? static_cast<int64_t>(l2) / 2 : int64_t{256} << 10;
  }();
  return half;
}

// On panels (PanelTile) only a panel's part of the tile need stay in cache, so the tile may be 4x larger (a
// 1 MB tile at 4096 inputs with AVX-512; each pool thread keeps its tile buffer for its life).
int TileVectors(int64_t n_cols, int64_t batch, bool panels = false) {
  const int64_t cap = panels ? 4 * HalfL2() : HalfL2();
  int nv = 4;
  while (nv > 1 && (n_cols * nv * kLanes * 4 > cap || (nv / 2) * kLanes >= batch)) nv /= 2;
  return nv;
}

// Multiply-adds below which the tiled paths run on the calling thread (one thread
// does about 4-8 per ns there; waking the pool costs tens of microseconds).
constexpr int64_t kTiledSerial = 1 << 19;

// Multiply-adds below which the tiled paths share their units (Shared) instead of handing
// them to ParallelFor: about 2-4 ms of work on two threads. Interleaved, 2 threads, 90%:
// 1024x1024 at batch 16 / 32 / 64 / 256 (up to 27M): 0.290 / 0.254 / 0.375 / 1.12 ms with
// ParallelFor against 0.211 / 0.197 / 0.292 / 1.06 ms shared; 4096x4096 at batch 32 (54M):
// 4.5-4.9 against 5.1-5.3 ms shared, and level at batch 256.
constexpr int64_t kTiledShared = 1 << 25;

// Whether p[0..n] never decreases: a branch-free reduction the compiler vectorises
// (16 compares per instruction with AVX-512), about 0.1 us for the 2k row pointers
// of a 1024x1024 layer, so checking them on every call costs nothing measurable.
inline bool NonDecreasing(const int32_t* p, int64_t n) {
  int bad = 0;
  for (int64_t r = 0; r < n; ++r) bad |= p[r + 1] < p[r];
  return bad == 0;
}

// Whether every p[k] < lim for k in [0, n), as unsigned (so negatives fail): a branch-free max
// reduction the compiler vectorises (16 lanes with AVX-512). The general kernels index with the
// columns and permutation entries unchecked, so the op checks each array a path reads here,
// once per call: about 1.5 us for the 105k columns of a 90%-sparse 1024x1024 layer, where a
// check per entry inside the kernels cost 40% of the batch-1 op (0.117 against 0.072 ms).
inline bool AllBelow(const int32_t* p, int64_t n, int64_t lim) {
  uint32_t hi = 0;
  for (int64_t k = 0; k < n; ++k) hi = std::max(hi, static_cast<uint32_t>(p[k]));
  return n == 0 || static_cast<int64_t>(hi) < lim;
}

// Input-axis panels (issue 33). Each stored entry of the tiled kernel above loads a row of W floats of the
// transposed input tile at a random column: with the tile in L2 (256 KB at 1024 inputs and 64 batch rows),
// the multiply-adds are bound by L2's bandwidth, about 2.7x dense's time per multiply-add. Cut the input axis
// into panels of `width` columns whose part of the tile fits L1 (kPanelBytes), and order M's entries panel by
// panel, row by row: then every output row adds its entries of one panel while that panel is in L1, and each
// row's W accumulators are loaded from and stored to an L2-resident output buffer once per (panel, row)
// segment rather than 4 x 64 B being pulled from L2 per entry. The order is the structure's panel section
// (prune.native.structure builds it with the rest of the structure, when the structure changes); each call
// gathers the values into that order (GatherValues), as the plain tiled path gathers them into W^T's.
// Building the order per call instead, or keeping it in the op and comparing the structure and values byte for
// byte on every call, cost about as much as the multiply-adds it saved (1024 x 1024, 90%, batch 256).
//
// Rounding: a row's sum is added panel by panel, so its float32 result differs in the last bits from the plain
// tiled kernel's, and which kernel runs depends on the batch and the threads (more batch tiles than threads):
// the same input row may round differently at batch 128 and 129, or on 2 and 8 threads. Both are within the
// float32 bound of any summation order (tests/prune/native/test_native_panels.py).
constexpr int64_t kPanelBytes = 32 << 10;     // a panel's part of the transposed tile: at most 32 of L1's 32-48 KB
constexpr int64_t kPanelOutBytes = 256 << 10;  // the output rows' accumulators one pass over the panels keeps

struct Panels {
  int64_t width = 0, count = 0;     // columns per panel, panels (0: no panel section)
  const int32_t* starts = nullptr;  // [count * n_rows + 1]: segment (p, r) = [starts[p n_rows + r], starts[p n_rows + r + 1])
  const int32_t* cols = nullptr;    // [nnz], panel by panel, row by row, as in M within each row
  const int32_t* perm = nullptr;    // [nnz]: the position in `values` of each
  const float* vals = nullptr;      // [nnz]: the values in this order (GatherValues, per call)
};

// Whether a tile of w batch rows runs on the structure's panels: a panel's part of the tile must fit kPanelBytes.
inline bool UsePanels(const Panels& pn, int64_t w) { return pn.count >= 2 && pn.width * w * 4 <= kPanelBytes; }

// The panel section of a structure (after the base parts and any block section), written by
// prune.native.structure when a layer is dense enough for panels to pay:
//
//   [ kPanelMagic | width | count | starts (count * n_out + 1) | pcols (nnz) | pperm (nnz) ]
//
// W^T's entries panel by panel (inputs [p width, (p + 1) width)), output row by output row, each row's in W^T's
// order: segment (p, r) is [starts[p n_out + r], starts[p n_out + r + 1]), pcols its inputs, pperm the position
// in `values` of each entry. UnpackPanels checks the header and the starts; the columns and permutation are
// checked in the value gather that every call runs before the tiles (GatherValues).
constexpr int32_t kPanelMagic = 0x6c6e5031;  // "1Pnl"

// dst[k] = values[perm[k]] for k < nnz: the values in the order of the columns `cols`, W^T's (the plain tiled
// path) or the panel section's. Every permutation entry (< nnz) and column (< n_cols) is checked as it is read
// (branch-free, clamped reads) rather than in a pass of its own: at 4096x4096 that pass re-read 13 MB per call.
// Returns false on an out-of-range entry. The reads land anywhere in `values` (W^T's order) or within one
// panel's stretch of it (840 KB at 4096 x 4096, 90%), so each is prefetched ahead; 16-wide AVX-512 gathers in
// place of the prefetched loop measured slower at 4096 x 4096.
bool GatherValues(OpKernelContext* ctx, const int32_t* perm_in, const int32_t* cols_in, int64_t n_cols,
                  const float* values, int64_t nnz, float* dst_out) {
  const int64_t units = std::min<int64_t>(NumThreads(ctx), (nnz + 32767) / 32768);
  const int64_t per = (nnz + units - 1) / units;
  std::atomic<bool> bad_any{false};
  Parallel(ctx, units, [&](int64_t u) {
    // Pointers in locals: read through the closure, they were reloaded after every store to dst, which
    // chained each (mostly L2-missing) value load to the previous one: 29% of the op's cycles at 4096x4096,
    // 90%, batch 256.
    const int32_t* __restrict perm = perm_in;
    const int32_t* __restrict cols = cols_in;
    const float* __restrict src = values;
    float* __restrict dst = dst_out;
    const uint32_t lim = static_cast<uint32_t>(nnz), col_lim = static_cast<uint32_t>(n_cols);
    uint32_t bad = 0;
    const int64_t e = std::min(nnz, (u + 1) * per);
    for (int64_t k = u * per; k < e; ++k) {
      // A prefetch never faults: the entry ahead needs no check (it gets its own when its turn comes).
      __builtin_prefetch(src + static_cast<uint32_t>(perm[std::min(k + kPrefetchAhead, e - 1)]));
      const uint32_t q = static_cast<uint32_t>(perm[k]);
      bad |= (q >= lim) | (static_cast<uint32_t>(cols[k]) >= col_lim);
      dst[k] = src[q < lim ? q : 0];
    }
    if (bad) bad_any = true;
  });
  return !bad_any;
}

// Tile of NV vectors of batch rows [b0, b0 + tb), output rows [r0, r1), on panels: y[b, r] = sum over the
// panels p of the entries of segment (p, r). The output rows go in chunks whose accumulators fit
// kPanelOutBytes; each chunk sweeps every panel. shared: as in Tile.
template <int NV>
void PanelTile(const float* x, int64_t b0, int64_t tb, const Csr& m, const Panels& pn, int64_t r0, int64_t r1,
               float* y, bool products, const float* shared, const TileFill* fill) {
  constexpr int64_t W = NV * kLanes;
  constexpr int64_t kRowBlock = 64;
  const int64_t n_cols = m.n_cols, n_rows = m.n_rows;
  const float* buf = TileBuffer(x, b0, tb, n_cols, W, shared, fill);
  const int64_t chunk = std::max<int64_t>(kRowBlock, kPanelOutBytes / (W * 4) / kRowBlock * kRowBlock);
  float* obuf = Scratch(1, std::min(chunk, r1 - r0) * W);
  const float* __restrict vals = pn.vals;
  const int32_t* __restrict cols = pn.cols;
  for (int64_t c0 = r0; c0 < r1; c0 += chunk) {
    const int64_t c1 = std::min(r1, c0 + chunk);
    for (int64_t p = 0; p < pn.count; ++p) {
      const int32_t* st = pn.starts + p * n_rows;
      for (int64_t r = c0; r < c1; ++r) {
        vec* o = reinterpret_cast<vec*>(obuf + (r - c0) * W);
        int64_t k = st[r];
        const int64_t e = products ? st[r + 1] : k;  // !products: the transposes alone (profile 3)
        if (p > 0 && k == e) continue;
        vec a[NV], b[NV];
        for (int q = 0; q < NV; ++q) {
          a[q] = p == 0 ? vec{} : o[q];
          b[q] = vec{};
        }
        AddEntries<NV, false>(buf, cols, nullptr, vals, k, e, 0, a, b);
        for (int q = 0; q < NV; ++q) o[q] = a[q] + b[q];
      }
    }
    for (int64_t rb = c0; rb < c1; rb += kRowBlock)  // 64 rows at a time
      StoreRows(obuf + (rb - c0) * W, W, rb, std::min(c1, rb + kRowBlock), b0, tb, n_rows, y);
  }
}

// y = x @ M^T for M given by CSR (rows = outputs): tiles over the batch. fill: the tiles' left operand
// (TileBuffer), x's rows when nullptr.
template <bool kPerm>
void TiledGather(OpKernelContext* ctx, const float* x, int64_t batch, const Csr& m, const float* vals, float* y,
                 bool products = true, const Panels* panels = nullptr, const TileFill* fill = nullptr) {
  const int threads = NumThreads(ctx);
  const int nv = TileVectors(m.n_cols, batch, panels != nullptr);
  const int64_t w = nv * kLanes, tiles = (batch + w - 1) / w;
  // Split output rows as well when there are fewer tiles than threads, unless the whole
  // product is smaller than waking the pool costs (kTiledSerial).
  const bool serial = m.rp[m.n_rows] * batch < kTiledSerial;
  const auto split = m.rp[m.n_rows] * batch < kTiledShared ? Shared : Parallel;
  const int64_t splits =
      serial ? 1 : std::max<int64_t>(1, std::min<int64_t>((2 * threads + tiles - 1) / tiles, (m.n_rows + 63) / 64));
  const std::vector<int64_t> bounds = SplitRows(m.rp, m.n_rows, splits);
  // One tile split over row ranges: transpose it once, in parallel, for all of them.
  float* shared = nullptr;
  if (tiles == 1 && splits > 1) {
    shared = Scratch(3, m.n_cols * w);  // the calling thread's buffer, read by the pool's threads
    const int64_t step = (m.n_cols + 8 * splits - 1) / (8 * splits) * 8;
    split(ctx, splits, [&](int64_t s) {
      const int64_t c0 = std::min(m.n_cols, s * step), c1 = std::min(m.n_cols, c0 + step);
      if (fill != nullptr) (*fill)(0, batch, w, c0, c1, shared);
      else TransposeTile(x, 0, batch, m.n_cols, w, c0, c1, shared);
    });
  }
  split(ctx, serial ? 1 : tiles * splits, [&](int64_t u) {
    for (int64_t v = serial ? 0 : u, e = serial ? tiles * splits : u + 1; v < e; ++v) {
      const int64_t t = v / splits, s = v % splits;
      const int64_t b0 = t * w, tb = std::min(w, batch - b0);
      if (bounds[s] >= bounds[s + 1]) continue;
      if (panels != nullptr) {
        switch (nv) {
          case 4: PanelTile<4>(x, b0, tb, m, *panels, bounds[s], bounds[s + 1], y, products, shared, fill); break;
          case 2: PanelTile<2>(x, b0, tb, m, *panels, bounds[s], bounds[s + 1], y, products, shared, fill); break;
          default: PanelTile<1>(x, b0, tb, m, *panels, bounds[s], bounds[s + 1], y, products, shared, fill); break;
        }
        continue;
      }
      switch (nv) {
        case 4: Tile<4, kPerm>(x, b0, tb, m, vals, bounds[s], bounds[s + 1], y, products, shared, fill); break;
        case 2: Tile<2, kPerm>(x, b0, tb, m, vals, bounds[s], bounds[s + 1], y, products, shared, fill); break;
        default: Tile<1, kPerm>(x, b0, tb, m, vals, bounds[s], bounds[s + 1], y, products, shared, fill); break;
      }
    }
  });
}

// Multiply-adds per unit of work of the small-batch paths (Shared): about 16 us on one
// thread (0.5 ns per multiply-add with AVX-512). An op of fewer runs on the calling
// thread alone, as one unit; units are sized by the work alone, not by the threads, so
// the scatter's partial sums add up in the same order on any machine. Interleaved at
// batch 1, 1024x1024, 2 threads, units of 32768 / 16384 multiply-adds against the
// previous two-way ParallelFor from 160k: 0.105 / 0.135 against 0.184 ms at 80%, 0.062 /
// 0.064 against 0.075 ms at 90%; level at 95% and 99% (one unit).
constexpr int64_t kSmallUnit = 32768;
constexpr int64_t kMaxSmallUnits = 16;

int64_t SmallUnits(int64_t work) { return std::min(kMaxSmallUnits, std::max<int64_t>(1, work / kSmallUnit)); }

// Small batch (B < one vector of rows), output rows [r0, r1): one dot product
// per output row and batch row over the row's entries, y[b, r] = sum_k
// value_k * x[b, cols[k]], with U independent accumulators per batch row
// (entries k, k + 1, ... go to different ones) so that the FMA latency does
// not chain. x's rows stay in L1/L2; nothing is transposed or buffered.
template <int B, bool kPerm>
void RowDots(const float* x, const Csr& m, const float* vals, int64_t r0, int64_t r1, float* y) {
  constexpr int U = B == 1 ? 4 : 2;
  const int64_t n_cols = m.n_cols, n_rows = m.n_rows;
  for (int64_t r = r0; r < r1; ++r) {
    float acc[U][B];
    for (int u = 0; u < U; ++u)
      for (int b = 0; b < B; ++b) acc[u][b] = 0.0f;
    int64_t k = m.rp[r];
    const int64_t e = m.rp[r + 1];
    for (; k + U <= e; k += U)
      for (int u = 0; u < U; ++u) {
        const uint32_t c = static_cast<uint32_t>(m.cols[k + u]);
        const float v = Value<kPerm>(m, vals, k + u);
        for (int b = 0; b < B; ++b) acc[u][b] += v * x[b * n_cols + c];
      }
    for (; k < e; ++k) {
      const uint32_t c = static_cast<uint32_t>(m.cols[k]);
      const float v = Value<kPerm>(m, vals, k);
      for (int b = 0; b < B; ++b) acc[0][b] += v * x[b * n_cols + c];
    }
    for (int b = 0; b < B; ++b) {
      float s = acc[0][b];
      for (int u = 1; u < U; ++u) s += acc[u][b];
      y[b * n_rows + r] = s;
    }
  }
}

// The entries [k, e) of a row left over by the vector loops of RowDots1*: their sum of value * x[col].
template <bool kPerm>
inline float RowTail(const float* x, const Csr& m, const float* vals, int64_t k, int64_t e) {
  float s0 = 0.0f, s1 = 0.0f;
  for (; k + 1 < e; k += 2) {
    s0 += Value<kPerm>(m, vals, k) * x[static_cast<uint32_t>(m.cols[k])];
    s1 += Value<kPerm>(m, vals, k + 1) * x[static_cast<uint32_t>(m.cols[k + 1])];
  }
  if (k < e) s0 += Value<kPerm>(m, vals, k) * x[static_cast<uint32_t>(m.cols[k])];
  return s0 + s1;
}

#ifdef PRUNE_AVX2
// Batch 1 with AVX2: sixteen entries at a time, x (and, with kPerm, the values)
// fetched by 8-wide vector gathers.
template <bool kPerm>
void RowDots1(const float* x, const Csr& m, const float* vals, int64_t r0, int64_t r1, float* y) {
  for (int64_t r = r0; r < r1; ++r) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t k = m.rp[r];
    const int64_t e = m.rp[r + 1];
    for (; k + 16 <= e; k += 16) {
      const __m256i c0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m.cols + k));
      const __m256i c1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m.cols + k + 8));
      __m256 v0, v1;
      if (kPerm) {
        v0 = _mm256_i32gather_ps(vals, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m.perm + k)), 4);
        v1 = _mm256_i32gather_ps(vals, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m.perm + k + 8)), 4);
      } else {
        v0 = _mm256_loadu_ps(vals + k);
        v1 = _mm256_loadu_ps(vals + k + 8);
      }
      a0 = _mm256_fmadd_ps(v0, _mm256_i32gather_ps(x, c0, 4), a0);
      a1 = _mm256_fmadd_ps(v1, _mm256_i32gather_ps(x, c1, 4), a1);
    }
    const float s = RowTail<kPerm>(x, m, vals, k, e);
    const __m256 a = _mm256_add_ps(a0, a1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    y[r] = _mm_cvtss_f32(h) + s;
  }
}
#endif

#ifdef __AVX512F__
// Batch 1 with AVX-512: as RowDots1, sixteen entries per vector gather.
template <bool kPerm>
void RowDots1x16(const float* x, const Csr& m, const float* vals, int64_t r0, int64_t r1, float* y) {
  for (int64_t r = r0; r < r1; ++r) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t k = m.rp[r];
    const int64_t e = m.rp[r + 1];
    for (; k + 32 <= e; k += 32) {
      const __m512i c0 = _mm512_loadu_si512(m.cols + k), c1 = _mm512_loadu_si512(m.cols + k + 16);
      __m512 v0, v1;
      if (kPerm) {
        v0 = _mm512_i32gather_ps(_mm512_loadu_si512(m.perm + k), vals, 4);
        v1 = _mm512_i32gather_ps(_mm512_loadu_si512(m.perm + k + 16), vals, 4);
      } else {
        v0 = _mm512_loadu_ps(vals + k);
        v1 = _mm512_loadu_ps(vals + k + 16);
      }
      a0 = _mm512_fmadd_ps(v0, _mm512_i32gather_ps(c0, x, 4), a0);
      a1 = _mm512_fmadd_ps(v1, _mm512_i32gather_ps(c1, x, 4), a1);
    }
    y[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) + RowTail<kPerm>(x, m, vals, k, e);
  }
}
#endif

template <int B, bool kPerm>
void SmallBatch(OpKernelContext* ctx, const float* x, const Csr& m, const float* vals, float* y) {
  const int64_t nnz = m.rp[m.n_rows];
  const int64_t units = SmallUnits(nnz * B);
  const std::vector<int64_t> bounds = SplitRows(m.rp, m.n_rows, units);
  Shared(ctx, units, [&](int64_t u) {
#if defined(__AVX512F__)
    if (B == 1) return RowDots1x16<kPerm>(x, m, vals, bounds[u], bounds[u + 1], y);
#elif defined(PRUNE_AVX2)
    if (B == 1) return RowDots1<kPerm>(x, m, vals, bounds[u], bounds[u + 1], y);
#endif
    RowDots<B, kPerm>(x, m, vals, bounds[u], bounds[u + 1], y);
  });
}

// Small batch, scatter along M's rows (rows = inputs here, M = W with values as
// stored): out[b, cols[k]] += vals[k] * x[b, r], each unit into its own
// partial output (unit 0 into y), summed at the end.
template <int B>
void ScatterRows(const float* x, const Csr& m, const float* vals, int64_t r0, int64_t r1, float* out) {
  const int64_t n_out = m.n_cols, n_in = m.n_rows;
  std::memset(out, 0, sizeof(float) * B * n_out);
  for (int64_t r = r0; r < r1; ++r) {
    float xv[B];
    bool any = false;
    for (int b = 0; b < B; ++b) any |= (xv[b] = x[b * n_in + r]) != 0.0f;
    if (!any) continue;  // e.g. a ReLU zero: the row adds nothing
    int64_t k = m.rp[r];
    const int64_t e = m.rp[r + 1];
    if (B == 1) {
      // A row's columns are distinct, so 8 entries' outputs are loaded before any is
      // stored: the loads do not wait for the stores before them as they may alias.
      for (; k + 8 <= e; k += 8) {
        uint32_t c[8];
        for (int u = 0; u < 8; ++u) c[u] = static_cast<uint32_t>(m.cols[k + u]);
        float o[8];
        for (int u = 0; u < 8; ++u) o[u] = out[c[u]];
        for (int u = 0; u < 8; ++u) out[c[u]] = o[u] + vals[k + u] * xv[0];
      }
    }
    for (; k < e; ++k) {
      const uint32_t c = static_cast<uint32_t>(m.cols[k]);
      const float v = vals[k];
      for (int b = 0; b < B; ++b) out[b * n_out + c] += v * xv[b];
    }
  }
}

template <int B>
void SmallScatter(OpKernelContext* ctx, const float* x, const Csr& m, const float* vals, float* y) {
  const int64_t n_out = m.n_cols, nnz = m.rp[m.n_rows];
  const int64_t units = SmallUnits(nnz * B);
  const std::vector<int64_t> bounds = SplitRows(m.rp, m.n_rows, units);
  // Unit u > 0 into its own partial output, summed in unit order. Left uninitialised here: ScatterRows
  // zeroes what it writes into (a zero-initialising std::vector cleared it twice).
  std::unique_ptr<float[]> partial(new float[(units - 1) * B * n_out]);
  Shared(ctx, units, [&](int64_t u) {
    ScatterRows<B>(x, m, vals, bounds[u], bounds[u + 1], u == 0 ? y : partial.get() + (u - 1) * B * n_out);
  });
  for (int64_t u = 1; u < units; ++u) {
    const float* p = partial.get() + (u - 1) * B * n_out;
    for (int64_t i = 0; i < B * n_out; ++i) y[i] += p[i];
  }
}

// Batches below one vector of rows: chunks of at most 8 rows (the widest SmallScatter
// instantiated), each a complete SmallScatter of its own rows. A loop, not a recursion: the
// recursion this replaced sent batch 8 on to a chunk of 0 rows, which its default case took
// for another 8 and wrote past y with ever more negative batches (16-lane builds, issue 31).
void SmallScatterAny(OpKernelContext* ctx, const float* x, int64_t batch, const Csr& m, const float* vals, float* y) {
  static_assert(kLanes <= 16, "SmallScatterAny takes batches below 16");
  for (int64_t b0 = 0; b0 < batch;) {
    const int64_t n = std::min<int64_t>(8, batch - b0);
    const float* xb = x + b0 * m.n_rows;
    float* yb = y + b0 * m.n_cols;
    switch (n) {
      case 1: SmallScatter<1>(ctx, xb, m, vals, yb); break;
      case 2: SmallScatter<2>(ctx, xb, m, vals, yb); break;
      case 3: SmallScatter<3>(ctx, xb, m, vals, yb); break;
      case 4: SmallScatter<4>(ctx, xb, m, vals, yb); break;
      case 5: SmallScatter<5>(ctx, xb, m, vals, yb); break;
      case 6: SmallScatter<6>(ctx, xb, m, vals, yb); break;
      case 7: SmallScatter<7>(ctx, xb, m, vals, yb); break;
      case 8: SmallScatter<8>(ctx, xb, m, vals, yb); break;
    }
    b0 += n;
  }
}

// As SmallScatterAny: chunks of at most 8 batch rows, each a complete SmallBatch.
template <bool kPerm>
void SmallGather(OpKernelContext* ctx, const float* x, int64_t batch, const Csr& m, const float* vals, float* y) {
  static_assert(kLanes <= 16, "SmallGather takes batches below 16");
  for (int64_t b0 = 0; b0 < batch;) {
    const int64_t n = std::min<int64_t>(8, batch - b0);
    const float* xb = x + b0 * m.n_cols;
    float* yb = y + b0 * m.n_rows;
    switch (n) {
      case 1: SmallBatch<1, kPerm>(ctx, xb, m, vals, yb); break;
      case 2: SmallBatch<2, kPerm>(ctx, xb, m, vals, yb); break;
      case 3: SmallBatch<3, kPerm>(ctx, xb, m, vals, yb); break;
      case 4: SmallBatch<4, kPerm>(ctx, xb, m, vals, yb); break;
      case 5: SmallBatch<5, kPerm>(ctx, xb, m, vals, yb); break;
      case 6: SmallBatch<6, kPerm>(ctx, xb, m, vals, yb); break;
      case 7: SmallBatch<7, kPerm>(ctx, xb, m, vals, yb); break;
      case 8: SmallBatch<8, kPerm>(ctx, xb, m, vals, yb); break;
    }
    b0 += n;
  }
}

// Checks the arrays of m that a general kernel reads: columns (< m.n_cols) and, when
// perm is set, the permutation (< nnz); split over the pool from 2^18 entries (a
// 4096x4096 layer at 90% has 1.7M: ~13 MB to read for both arrays).
Status CheckEntries(OpKernelContext* ctx, const Csr& m, int64_t nnz, const char* what) {
  const int64_t units = std::min<int64_t>(NumThreads(ctx), std::max<int64_t>(1, nnz >> 18));
  const int64_t per = (nnz + units - 1) / units;
  std::atomic<bool> bad_col{false}, bad_perm{false};
  Parallel(ctx, units, [&](int64_t u) {
    const int64_t k0 = std::min(nnz, u * per), n = std::min(nnz, k0 + per) - k0;
    if (!AllBelow(m.cols + k0, n, m.n_cols)) bad_col = true;
    if (m.perm != nullptr && !AllBelow(m.perm + k0, n, nnz)) bad_perm = true;
  });
  if (bad_col) return errors::InvalidArgument("structure holds an out-of-range column in ", what);
  if (bad_perm) return errors::InvalidArgument("structure holds an out-of-range permutation entry in ", what);
  return OkStatus();
}

#include "block_ops.h"
#include "nm_ops.h"

Status UnpackPanels(const int32_t* s, int64_t len, int64_t nnz, int64_t n_in, int64_t n_out, Panels* pn,
                    int64_t* used) {
  if (len < 3 || s[0] != kPanelMagic) return errors::InvalidArgument("structure has a malformed panel section");
  const int64_t width = s[1], count = s[2];
  if (width < 1 || n_in < 1 || count != (n_in + width - 1) / width)
    return errors::InvalidArgument("structure has a malformed panel section (width ", width, ", ", count, " panels for ",
                                   n_in, " inputs)");
  const int64_t size = 3 + count * n_out + 1 + 2 * nnz;
  if (size > len) return errors::InvalidArgument("structure's panel section is cut short (", len, " of ", size, " entries)");
  const int32_t* starts = s + 3;
  if (starts[0] != 0 || starts[count * n_out] != nnz) return errors::InvalidArgument("structure panel starts do not span nnz");
  if (!NonDecreasing(starts, count * n_out)) return errors::InvalidArgument("structure panel starts decrease");
  pn->width = width;
  pn->count = count;
  pn->starts = starts;
  pn->cols = starts + count * n_out + 1;
  pn->perm = pn->cols + nnz;
  *used = size;
  return OkStatus();
}

// Reads the structure vector; checks its length and row pointers, and those of the sections that may follow
// (a block section into *blocks, whose c stays 0 without one; a panel section into *panels, whose count stays 0;
// an N:M section into *nm_out, whose n stays 0, when given, else only checked for its header and length).
Status Unpack(const Tensor& structure, int64_t nnz, int64_t n_in, int64_t n_out, Csr* w, Csr* wt, BlockCsr* blocks,
              Panels* panels, NmSection* nm_out = nullptr) {
  NmSection nm_local;
  NmSection* nm = nm_out != nullptr ? nm_out : &nm_local;
  const int64_t base = 3 * nnz + n_in + n_out + 2;
  if (structure.dims() != 1 || structure.dim_size(0) < base) {
    return errors::InvalidArgument("structure must have 3 * nnz + n_in + n_out + 2 = ", base,
                                   " entries (then possibly a block and a panel section) for nnz ", nnz, ", got shape ",
                                   structure.shape().DebugString());
  }
  const int32_t* s = structure.flat<int32_t>().data();
  const int64_t len = structure.dim_size(0);
  for (int64_t o = base; o < len;) {
    int64_t used = 0;
    if (s[o] == kBlockMagic && blocks->c == 0 && panels->count == 0) {
      TF_RETURN_IF_ERROR(UnpackBlocks(s + o, len - o, nnz, n_in, n_out, blocks, &used));
    } else if (s[o] == kPanelMagic && panels->count == 0) {
      TF_RETURN_IF_ERROR(UnpackPanels(s + o, len - o, nnz, n_in, n_out, panels, &used));
    } else if (s[o] == kNmMagic && nm->n == 0) {
      TF_RETURN_IF_ERROR(UnpackNm(s + o, len - o, n_in, n_out, nm, &used));
    } else {
      return errors::InvalidArgument("structure has a malformed section at entry ", o,
                                     " (a block section, then a panel section, or an N:M section, may follow the base "
                                     "parts)");
    }
    o += used;
  }
  *w = Csr{s, s + n_in + 1, nullptr, n_in, n_out};
  const int32_t* t = s + n_in + 1 + nnz;
  *wt = Csr{t, t + n_out + 1, t + n_out + 1 + nnz, n_out, n_in};
  for (const Csr* m : {w, wt}) {
    if (m->rp[0] != 0 || m->rp[m->n_rows] != nnz) return errors::InvalidArgument("structure row pointers do not span nnz");
    if (!NonDecreasing(m->rp, m->n_rows)) return errors::InvalidArgument("structure row pointers decrease");
  }
  return OkStatus();
}

class PruneSpmmOp : public OpKernel {
 public:
  explicit PruneSpmmOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n_in", &n_in_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n_out", &n_out_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose", &transpose_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("profile", &profile_));
    // The structure indexes with int32 (prune.native.structure refuses larger layers), and the section sizes
    // (3 nnz + n_in + n_out, count * n_out) must not overflow int64.
    OP_REQUIRES(ctx, n_in_ < (int64_t{1} << 31) && n_out_ < (int64_t{1} << 31),
                errors::InvalidArgument("n_in and n_out must be below 2^31, got ", n_in_, " and ", n_out_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x_t = ctx->input(0);
    const Tensor& values_t = ctx->input(1);
    const int64_t n_x = transpose_ ? n_out_ : n_in_, n_y = transpose_ ? n_in_ : n_out_;
    OP_REQUIRES(ctx, x_t.dims() == 2 && x_t.dim_size(1) == n_x,
                errors::InvalidArgument("x must be [batch, ", n_x, "], got shape ", x_t.shape().DebugString()));
    OP_REQUIRES(ctx, values_t.dims() == 1,
                errors::InvalidArgument("values must be 1-D, got shape ", values_t.shape().DebugString()));
    const int64_t nnz = values_t.dim_size(0), batch = x_t.dim_size(0);
    Csr w, wt;
    BlockCsr blocks;
    Panels panels;
    NmSection nm;
    OP_REQUIRES_OK(ctx, Unpack(ctx->input(2), nnz, n_in_, n_out_, &w, &wt, &blocks, &panels, &nm));
    Tensor* y_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, n_y}), &y_t));
    float* y = y_t->flat<float>().data();
    if (batch == 0 || n_y == 0) return;
    if (nnz == 0) {
      std::memset(y, 0, sizeof(float) * batch * n_y);
      return;
    }
    const float* x = x_t.flat<float>().data();
    const float* values = values_t.flat<float>().data();
    // Both directions gather: dx = dy @ W^T along W's rows with the values as
    // stored; y = x @ W along W^T's rows with the values read through tperm.
    enum { kBlocks, kNm, kInputGrad, kRowGather, kScatter, kTiledPerm, kTiledGathered } path;
    const int64_t tile_rows = TileVectors(n_in_, batch) * kLanes;
    // On panels: more tiles than threads, at the panels' own tile width (the L2 bound does not apply there).
    const int64_t panel_rows = TileVectors(n_in_, batch, true) * kLanes;
    const bool on_panels = !transpose_ && batch >= kLanes && profile_ != 6 && UsePanels(panels, panel_rows) &&
                           (batch + panel_rows - 1) / panel_rows > NumThreads(ctx);
    if (UseBlocks(blocks, batch) && profile_ != 4) path = kBlocks;  // a blocked structure (profile 4: general kernels)
    // An N:M section: its kernel from 2 rows, up to the panels (measurements in the header above).
    else if (nm.n != 0 && !transpose_ && profile_ != 7 && batch >= 2 && !on_panels) path = kNm;  // 7: general
    else if (transpose_) path = kInputGrad;
    else if (batch == 1 && profile_ == 5) path = kRowGather;
    else if (batch < kLanes) path = kScatter;
    else if (on_panels) path = kTiledGathered;
    else if ((batch + tile_rows - 1) / tile_rows <= NumThreads(ctx)) path = kTiledPerm;
    else path = kTiledGathered;
    // The general kernels index with the structure unchecked: check the arrays this path reads.
    if (path == kInputGrad || path == kScatter) OP_REQUIRES_OK(ctx, CheckEntries(ctx, w, nnz, "W's rows"));
    else if (path == kRowGather || path == kTiledPerm) OP_REQUIRES_OK(ctx, CheckEntries(ctx, wt, nnz, "W^T's rows"));
    // kTiledGathered checks W^T's columns and permutation in its gather pass, before the tiles.
    if (profile_ == 1) return;  // benchmark only: the checks and the output allocation (y left unwritten)
    Error err;  // the block kernels check their structure as they go
    switch (path) {
      case kNm:  // checks every code and slot in its value gather, before the products
        OP_REQUIRES(ctx,
                    NmForward(ctx, x, batch, nm, n_in_, n_out_, values, nnz, y, profile_ == 2,
                              profile_ >= 8 ? static_cast<int>(profile_) - 7 : 0),
                    errors::InvalidArgument("structure's N:M section holds an out-of-range code or slot"));
        break;
      case kBlocks:
        if (transpose_) {
          PRUNE_BLOCK_DISPATCH(blocks.c, BlockInputGrad, ctx, x, batch, blocks, values, nnz, y, &err)
        } else {
          PRUNE_BLOCK_DISPATCH(blocks.c, BlockForward, ctx, x, batch, blocks, values, nnz, y, &err)
        }
        break;
      case kInputGrad:  // dx = dy @ W^T: gathers along W's rows, values as stored
        if (batch < kLanes) SmallGather<false>(ctx, x, batch, w, values, y);
        else TiledGather<false>(ctx, x, batch, w, values, y, profile_ != 3);
        break;
      case kRowGather:  // batch 1: a row gather over W^T, values through tperm
        SmallGather<true>(ctx, x, batch, wt, values, y);
        break;
      case kScatter:  // y = x @ W, small batch: scatters along W's rows, values as stored
        SmallScatterAny(ctx, x, batch, w, values, y);
        break;
      case kTiledPerm:
        // y = x @ W, at most one batch tile per thread: gathers along W^T's rows,
        // reading each value through tperm as it is used (one pass over the values).
        TiledGather<true>(ctx, x, batch, wt, values, y, profile_ != 3);
        break;
      case kTiledGathered: {
        // More tiles than threads: gather the values into W^T order once (each
        // tile would otherwise repeat the indirect reads), then the tiles; on panels
        // when the segments are long enough (UsePanels), gathered into the panel order.
        float* tv = Scratch(2, nnz);
        if (on_panels) {
          OP_REQUIRES(ctx, GatherValues(ctx, panels.perm, panels.cols, n_in_, values, nnz, tv),
                      errors::InvalidArgument("structure holds an out-of-range column or permutation entry in its "
                                              "panel section"));
          panels.vals = tv;
          if (profile_ != 2) TiledGather<false>(ctx, x, batch, wt, values, y, profile_ != 3, &panels);
          break;
        }
        OP_REQUIRES(ctx, GatherValues(ctx, wt.perm, wt.cols, n_in_, values, nnz, tv),
                    errors::InvalidArgument("structure holds an out-of-range column or permutation entry in W^T's "
                                            "rows"));
        if (profile_ != 2) TiledGather<false>(ctx, x, batch, wt, tv, y, profile_ != 3);
        break;
      }
    }
    OP_REQUIRES(ctx, !err.bad, errors::InvalidArgument("structure's block section holds an out-of-range entry"));
  }

 private:
  int64_t n_in_, n_out_, profile_;
  bool transpose_;
};

// Transposes columns [c0, c1) of a [batch, n] matrix into out[c * bp + b], zero-padding b >= batch.
void TransposePad(const float* a, int64_t batch, int64_t n, int64_t bp, int64_t c0, int64_t c1, float* out) {
  for (int64_t cb = c0; cb < c1; cb += 16) {
    const int64_t ce = std::min(c1, cb + 16);
    for (int64_t b = 0; b < batch; ++b) {
      const float* src = a + b * n;
      for (int64_t c = cb; c < ce; ++c) out[c * bp + b] = src[c];
    }
    for (int64_t c = cb; c < ce; ++c)
      for (int64_t b = batch; b < bp; ++b) out[c * bp + b] = 0.0f;
  }
}

class PruneSddmmOp : public OpKernel {
 public:
  explicit PruneSddmmOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n_in", &n_in_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n_out", &n_out_));
    int64_t profile = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("profile", &profile));
    nm_ = profile != 7;
    OP_REQUIRES(ctx, n_in_ < (int64_t{1} << 31) && n_out_ < (int64_t{1} << 31),
                errors::InvalidArgument("n_in and n_out must be below 2^31, got ", n_in_, " and ", n_out_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x_t = ctx->input(0);
    const Tensor& dy_t = ctx->input(1);
    const Tensor& values_t = ctx->input(2);
    OP_REQUIRES(ctx, x_t.dims() == 2 && dy_t.dims() == 2 && x_t.dim_size(0) == dy_t.dim_size(0) &&
                         x_t.dim_size(1) == n_in_ && dy_t.dim_size(1) == n_out_,
                errors::InvalidArgument("x and dy must be [batch, ", n_in_, "] and [batch, ", n_out_, "], got shapes ",
                                        x_t.shape().DebugString(), " and ", dy_t.shape().DebugString()));
    OP_REQUIRES(ctx, values_t.dims() == 1,
                errors::InvalidArgument("values must be 1-D, got shape ", values_t.shape().DebugString()));
    const int64_t nnz = values_t.dim_size(0), batch = x_t.dim_size(0), n_in = n_in_, n_out = n_out_;
    Csr w, wt;
    BlockCsr blocks;
    Panels panels;  // not read by the values gradient
    NmSection nm;
    OP_REQUIRES_OK(ctx, Unpack(ctx->input(3), nnz, n_in, n_out, &w, &wt, &blocks, &panels, &nm));
    Tensor* dv_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({nnz}), &dv_t));
    float* dv = dv_t->flat<float>().data();
    if (nnz == 0) return;
    if (batch == 0) {
      std::memset(dv, 0, sizeof(float) * nnz);
      return;
    }
    const float* x = x_t.flat<float>().data();
    const float* dy = dy_t.flat<float>().data();
    const int threads = NumThreads(ctx);
    Error err;  // the block kernels check their structure as they go
    const int64_t units = std::min<int64_t>(2 * threads, std::max<int64_t>(1, nnz / 4096));
    const std::vector<int64_t> bounds = SplitRows(w.rp, n_in, units);
    const bool blocked = UseBlocks(blocks, batch);
    if (!blocked && nm.n != 0 && nm_) {  // checks every code and slot of a block before its products
      OP_REQUIRES(ctx, NmValuesGrad(ctx, x, dy, batch, n_in, n_out, nm, nnz, dv),
                  errors::InvalidArgument("structure's N:M section holds an out-of-range code or slot"));
      return;
    }
    if (!blocked) OP_REQUIRES_OK(ctx, CheckEntries(ctx, w, nnz, "W's rows"));  // the loops below index unchecked

    if (blocked) {
      PRUNE_BLOCK_DISPATCH(blocks.c, BlockValuesGrad, ctx, x, dy, batch, blocks, nnz, dv, &err)
    } else if (batch < kLanes) {
      Parallel(ctx, units, [&](int64_t u) {
        for (int64_t i = bounds[u]; i < bounds[u + 1]; ++i) {
          for (int64_t k = w.rp[i]; k < w.rp[i + 1]; ++k) {
            const uint32_t j = static_cast<uint32_t>(w.cols[k]);
            float s = 0.0f;
            for (int64_t b = 0; b < batch; ++b) s += x[b * n_in + i] * dy[b * n_out + j];
            dv[k] = s;
          }
        }
      });
    } else {
      const int64_t bp = (batch + kLanes - 1) / kLanes * kLanes, nv = bp / kLanes;
      Tensor xt_t, dyt_t;  // TF's CPU allocator aligns to 64 bytes
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_FLOAT, TensorShape({n_in * bp}), &xt_t));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_FLOAT, TensorShape({n_out * bp}), &dyt_t));
      float* xt = xt_t.flat<float>().data();
      float* dyt = dyt_t.flat<float>().data();
      const int64_t tu = threads;
      Parallel(ctx, 2 * tu, [&](int64_t u) {
        const bool is_x = u < tu;
        const int64_t n = is_x ? n_in : n_out, part = is_x ? u : u - tu;
        const int64_t step = ((n + tu - 1) / tu + 15) / 16 * 16;
        const int64_t c0 = std::min(n, part * step), c1 = std::min(n, c0 + step);
        TransposePad(is_x ? x : dy, batch, n, bp, c0, c1, is_x ? xt : dyt);
      });
      Parallel(ctx, units, [&](int64_t u) {
        for (int64_t i = bounds[u]; i < bounds[u + 1]; ++i) {
          const vec* a = reinterpret_cast<const vec*>(xt + i * bp);
          for (int64_t k = w.rp[i]; k < w.rp[i + 1]; ++k) {
            const uint32_t j = static_cast<uint32_t>(w.cols[k]);
            const vec* b = reinterpret_cast<const vec*>(dyt + j * bp);
            vec s0 = vec{}, s1 = vec{}, s2 = vec{}, s3 = vec{};
            int64_t q = 0;
            for (; q + 3 < nv; q += 4) {
              s0 += a[q] * b[q];
              s1 += a[q + 1] * b[q + 1];
              s2 += a[q + 2] * b[q + 2];
              s3 += a[q + 3] * b[q + 3];
            }
            for (; q < nv; ++q) s0 += a[q] * b[q];
            const vec s = (s0 + s1) + (s2 + s3);
            float total = 0.0f;
            for (int l = 0; l < kLanes; ++l) total += s[l];
            dv[k] = total;
          }
        }
      });
    }
    OP_REQUIRES(ctx, !err.bad, errors::InvalidArgument("structure's block section holds an out-of-range entry"));
  }

 private:
  int64_t n_in_, n_out_;
  bool nm_;
};


// -- Sparse 2-D convolution (PruneConv2d): implicit im2col -----------------------------------------------------
//
// y[b, oy, ox, o] = sum over the stored entries (i, o) of W of value * patch(b, oy, ox)[i], where W is the patch
// matrix [kh * kw * C, n_out] (row i = (dy * kw + dx) * C + c, a Conv2D kernel read row-major) and
// patch(b, oy, ox)[i] = x[b, oy * sh - pt + dy * dh, ox * sw - pl + dx * dw, c], zero outside the image (TF's
// padding: pt, pl = half the padding a dimension needs, rounded down). The output positions p = (b, oy, ox) are
// the rows of the tiled forward kernel: TiledGather over W^T's rows with the values gathered into W^T's (or the
// panel section's) order once per call, as PruneSpmm runs a batch of more tiles than threads. Each tile's
// transposed patches are written by PatchTile straight from x into the tile buffer (K x W floats, sized to half
// of L2 by TileVectors), so the [positions, K] patch matrix never exists whole. A block section is not used
// here (the block kernels read their input rows directly); the 1 x 1 convolutions, which are plain products over
// [B H W, C], run PruneSpmm with it.

struct ConvGeom {
  int64_t h, w, c, kw, sh, sw, dh, dw, pt, pl, oh, ow;
};

// buf[i * W + q] for patch rows i in [i0, i1) and output positions p0 + q, q < W (zero for q >= tb and outside
// the image). Eight positions at a time: where all eight read inside the image, eight channels at a time go
// through an 8 x 8 register transpose (AVX2), the positions' pixels being C contiguous floats each.
void PatchTile(const float* x, const ConvGeom& g, int64_t p0, int64_t tb, int64_t W, int64_t i0, int64_t i1,
               float* buf) {
  const int64_t per_image = g.oh * g.ow;
  for (int64_t q0 = 0; q0 < W; q0 += 8) {
    const int jn = static_cast<int>(std::min<int64_t>(8, W - q0));
    int64_t base[8], iy0[8], ix0[8];
    bool live[8];
    for (int j = 0; j < jn; ++j) {
      live[j] = q0 + j < tb;
      const int64_t p = live[j] ? p0 + q0 + j : p0, b = p / per_image, r = p % per_image;
      base[j] = b * g.h;
      iy0[j] = (r / g.ow) * g.sh - g.pt;
      ix0[j] = (r % g.ow) * g.sw - g.pl;
    }
    for (int64_t tap = i0 / g.c; tap * g.c < i1; ++tap) {
      const int64_t dy = tap / g.kw, dx = tap % g.kw;
      const int64_t c0 = std::max<int64_t>(i0 - tap * g.c, 0), c1 = std::min<int64_t>(i1 - tap * g.c, g.c);
      const float* src[8];
      bool all = jn == 8;
      for (int j = 0; j < jn; ++j) {
        const int64_t iy = iy0[j] + dy * g.dh, ix = ix0[j] + dx * g.dw;
        const bool in = live[j] && iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
        src[j] = in ? x + ((base[j] + iy) * g.w + ix) * g.c : nullptr;
        all = all && in;
      }
      float* dst = buf + tap * g.c * W + q0;
      int64_t c = c0;
#ifdef PRUNE_AVX2
      if (all) {
        for (; c + 8 <= c1; c += 8) {
          const float* rows[8];
          for (int j = 0; j < 8; ++j) rows[j] = src[j] + c;
          TransposeRows8(rows, dst + c * W, W);
        }
      }
#endif
      for (; c < c1; ++c)
        for (int j = 0; j < jn; ++j) dst[c * W + j] = src[j] != nullptr ? src[j][c] : 0.0f;
    }
  }
}

// One spatial dimension of TF's convolution: the output size and the padding before it ("SAME": ceil(in /
// stride), half the needed padding rounded down first; "VALID": no padding).
void ConvDim(int64_t in, int64_t k, int64_t stride, int64_t dilation, bool same, int64_t* out, int64_t* pad) {
  const int64_t eff = (k - 1) * dilation + 1;
  if (same) {
    *out = (in + stride - 1) / stride;
    *pad = std::max<int64_t>(0, (*out - 1) * stride + eff - in) / 2;
  } else {
    *out = in >= eff ? (in - eff) / stride + 1 : 0;
    *pad = 0;
  }
}

// The geometry attributes PruneConv2d and PruneCol2im share, as TF's Conv2D reads them (two values each).
struct ConvAttrs {
  std::vector<int32> kernel, strides, dilations;
  bool same = false;
};

Status ReadConvAttrs(OpKernelConstruction* ctx, ConvAttrs* a) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("kernel_size", &a->kernel));
  TF_RETURN_IF_ERROR(ctx->GetAttr("strides", &a->strides));
  TF_RETURN_IF_ERROR(ctx->GetAttr("dilations", &a->dilations));
  std::string padding;
  TF_RETURN_IF_ERROR(ctx->GetAttr("padding", &padding));
  a->same = padding == "SAME";
  for (const auto* v : {&a->kernel, &a->strides, &a->dilations}) {
    if (v->size() != 2 || (*v)[0] < 1 || (*v)[1] < 1 || (*v)[0] >= (1 << 16) || (*v)[1] >= (1 << 16))
      return errors::InvalidArgument("kernel_size, strides and dilations must be two integers in [1, 65535]");
  }
  return OkStatus();
}

// The geometry of a convolution of the NHWC x (4-D, checked by the caller) with these attributes.
ConvGeom Geometry(const ConvAttrs& a, const Tensor& x) {
  ConvGeom g{x.dim_size(1), x.dim_size(2), x.dim_size(3), a.kernel[1], a.strides[0], a.strides[1], a.dilations[0],
             a.dilations[1], 0, 0, 0, 0};
  ConvDim(g.h, a.kernel[0], g.sh, g.dh, a.same, &g.oh, &g.pt);
  ConvDim(g.w, a.kernel[1], g.sw, g.dw, a.same, &g.ow, &g.pl);
  return g;
}

class PruneConv2dOp : public OpKernel {
 public:
  explicit PruneConv2dOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n_in", &n_in_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n_out", &n_out_));
    OP_REQUIRES_OK(ctx, ReadConvAttrs(ctx, &attrs_));
    OP_REQUIRES(ctx, n_in_ < (int64_t{1} << 31) && n_out_ < (int64_t{1} << 31),
                errors::InvalidArgument("n_in and n_out must be below 2^31, got ", n_in_, " and ", n_out_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x_t = ctx->input(0);
    const Tensor& values_t = ctx->input(1);
    const int64_t taps = int64_t{attrs_.kernel[0]} * attrs_.kernel[1];
    OP_REQUIRES(ctx, x_t.dims() == 4 && x_t.dim_size(3) * taps == n_in_,
                errors::InvalidArgument("x must be [batch, height, width, ", n_in_ / taps, "] for n_in ", n_in_, " and a ",
                                        attrs_.kernel[0], "x", attrs_.kernel[1], " kernel, got shape ", x_t.shape().DebugString()));
    OP_REQUIRES(ctx, values_t.dims() == 1,
                errors::InvalidArgument("values must be 1-D, got shape ", values_t.shape().DebugString()));
    const int64_t nnz = values_t.dim_size(0), batch = x_t.dim_size(0);
    Csr w, wt;
    BlockCsr blocks;
    Panels panels;
    OP_REQUIRES_OK(ctx, Unpack(ctx->input(2), nnz, n_in_, n_out_, &w, &wt, &blocks, &panels));
    const ConvGeom g = Geometry(attrs_, x_t);
    Tensor* y_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, g.oh, g.ow, n_out_}), &y_t));
    float* y = y_t->flat<float>().data();
    const int64_t positions = batch * g.oh * g.ow;
    if (positions == 0 || n_out_ == 0) return;
    if (nnz == 0) {
      std::memset(y, 0, sizeof(float) * positions * n_out_);
      return;
    }
    const float* x = x_t.flat<float>().data();
    const float* values = values_t.flat<float>().data();
    const int64_t panel_rows = TileVectors(n_in_, positions, true) * kLanes;
    const bool on_panels = UsePanels(panels, panel_rows) && (positions + panel_rows - 1) / panel_rows > NumThreads(ctx);
    const TileFill fill = [&](int64_t p0, int64_t tb, int64_t W, int64_t i0, int64_t i1, float* buf) {
      PatchTile(x, g, p0, tb, W, i0, i1, buf);
    };
    float* tv = Scratch(2, nnz);
    // The gather checks every column and permutation entry the tiles then read unchecked.
    if (on_panels) {
      OP_REQUIRES(ctx, GatherValues(ctx, panels.perm, panels.cols, n_in_, values, nnz, tv),
                  errors::InvalidArgument("structure holds an out-of-range column or permutation entry in its panel "
                                          "section"));
      panels.vals = tv;
      TiledGather<false>(ctx, x, positions, wt, values, y, true, &panels, &fill);
      return;
    }
    OP_REQUIRES(ctx, GatherValues(ctx, wt.perm, wt.cols, n_in_, values, nnz, tv),
                errors::InvalidArgument("structure holds an out-of-range column or permutation entry in W^T's rows"));
    TiledGather<false>(ctx, x, positions, wt, tv, y, true, nullptr, &fill);
  }

 private:
  int64_t n_in_, n_out_;
  ConvAttrs attrs_;
};

// dx = the input gradient of a convolution's patches: dx[b, iy, ix, c] = sum of dp[b, oy, ox, (dy * kw + dx) * C + c]
// over the positions and taps that read (iy, ix), the transpose of PatchTile's gather (col2im). The backward pass
// of PruneConv2d: dp = dy @ W^T comes from PruneSpmm (transpose). One image per unit of work, so no two threads
// add into the same pixels; each tap adds C contiguous floats.
class PruneCol2imOp : public OpKernel {
 public:
  explicit PruneCol2imOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadConvAttrs(ctx, &attrs_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& dp_t = ctx->input(0);
    const Tensor& x_t = ctx->input(1);  // read for its shape only
    OP_REQUIRES(ctx, x_t.dims() == 4, errors::InvalidArgument("x must be 4-D, got shape ", x_t.shape().DebugString()));
    const ConvGeom g = Geometry(attrs_, x_t);
    const int64_t batch = x_t.dim_size(0), k = int64_t{attrs_.kernel[0]} * attrs_.kernel[1] * g.c;
    OP_REQUIRES(ctx, dp_t.dims() == 4 && dp_t.dim_size(0) == batch && dp_t.dim_size(1) == g.oh &&
                         dp_t.dim_size(2) == g.ow && dp_t.dim_size(3) == k,
                errors::InvalidArgument("dp must be [", batch, ", ", g.oh, ", ", g.ow, ", ", k, "] for x of shape ",
                                        x_t.shape().DebugString(), ", got shape ", dp_t.shape().DebugString()));
    Tensor* dx_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, x_t.shape(), &dx_t));
    float* dx = dx_t->flat<float>().data();
    const float* dp = dp_t.flat<float>().data();
    const int64_t image = g.h * g.w * g.c, kh = attrs_.kernel[0];
    Parallel(ctx, batch, [&](int64_t b) {
      float* out = dx + b * image;
      std::memset(out, 0, sizeof(float) * image);
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const float* row = dp + ((b * g.oh + oy) * g.ow + ox) * k;
          for (int64_t dy = 0; dy < kh; ++dy) {
            const int64_t iy = oy * g.sh - g.pt + dy * g.dh;
            if (iy < 0 || iy >= g.h) continue;
            for (int64_t dx_ = 0; dx_ < g.kw; ++dx_) {
              const int64_t ix = ox * g.sw - g.pl + dx_ * g.dw;
              if (ix < 0 || ix >= g.w) continue;
              float* __restrict o = out + (iy * g.w + ix) * g.c;
              const float* __restrict src = row + (dy * g.kw + dx_) * g.c;
              for (int64_t c = 0; c < g.c; ++c) o[c] += src[c];
            }
          }
        }
      }
    });
  }

 private:
  ConvAttrs attrs_;
};
}  // namespace

// The vector path compiled in, for prune.native.status() (read with ctypes); the
// instruction-set name is also a plain string in the object, for compile checks.
extern "C" __attribute__((visibility("default"), used)) const char prune_native_isa[] = "prune-isa:" PRUNE_ISA;
extern "C" __attribute__((visibility("default"))) const char* prune_native_vector_path() {
  static const std::string path = std::string(PRUNE_ISA) + " (" + std::to_string(kLanes) + " lanes)";
  return path.c_str();
}

REGISTER_OP("PruneSpmm")
    .Input("x: float")
    .Input("values: float")
    .Input("structure: int32")
    .Attr("n_in: int >= 0")
    .Attr("n_out: int >= 0")
    .Attr("transpose: bool = false")
    .Attr("profile: int = 0")
    .Output("y: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      int64_t n_in, n_out;
      bool transpose;
      TF_RETURN_IF_ERROR(c->GetAttr("n_in", &n_in));
      TF_RETURN_IF_ERROR(c->GetAttr("n_out", &n_out));
      TF_RETURN_IF_ERROR(c->GetAttr("transpose", &transpose));
      c->set_output(0, c->Matrix(c->Dim(x, 0), transpose ? n_in : n_out));
      return OkStatus();
    })
    .Doc("y = x @ W (transpose=false) or x @ W^T (transpose=true) for W [n_in, n_out] given by values and structure; "
         "profile != 0 stops early, for benchmarks only (see the source's header).");

REGISTER_OP("PruneSddmm")
    .Input("x: float")
    .Input("dy: float")
    .Input("values: float")
    .Input("structure: int32")
    .Attr("n_in: int >= 0")
    .Attr("n_out: int >= 0")
    .Attr("profile: int = 0")
    .Output("dv: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(2));
      return OkStatus();
    })
    .Doc("dv[k] = sum_b x[b, i_k] * dy[b, j_k] over W's stored entries k = (i_k, j_k); values gives only nnz.");

REGISTER_OP("PruneConv2d")
    .Input("x: float")
    .Input("values: float")
    .Input("structure: int32")
    .Attr("n_in: int >= 0")
    .Attr("n_out: int >= 0")
    .Attr("kernel_size: list(int)")
    .Attr("strides: list(int)")
    .Attr("dilations: list(int)")
    .Attr("padding: {'SAME', 'VALID'}")
    .Output("y: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 4, &x));
      int64_t n_out;
      TF_RETURN_IF_ERROR(c->GetAttr("n_out", &n_out));
      c->set_output(0, c->MakeShape({c->Dim(x, 0), c->UnknownDim(), c->UnknownDim(), n_out}));
      return OkStatus();
    })
    .Doc("y = conv2d(x, W) (NHWC) for the patch matrix W [kh * kw * C, n_out] given by values and structure, with "
         "TF's strides, dilations and padding; the patches are formed one tile at a time, in cache.");

REGISTER_OP("PruneCol2im")
    .Input("dp: float")
    .Input("x: float")
    .Attr("kernel_size: list(int)")
    .Attr("strides: list(int)")
    .Attr("dilations: list(int)")
    .Attr("padding: {'SAME', 'VALID'}")
    .Output("dx: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      return OkStatus();
    })
    .Doc("dx (shaped as x) = the sum into each input pixel of the patch gradients dp [batch, H_out, W_out, kh * kw * C] "
         "that read it (col2im), for TF's strides, dilations and padding.");

REGISTER_KERNEL_BUILDER(Name("PruneSpmm").Device(DEVICE_CPU), PruneSpmmOp);
REGISTER_KERNEL_BUILDER(Name("PruneSddmm").Device(DEVICE_CPU), PruneSddmmOp);
REGISTER_KERNEL_BUILDER(Name("PruneConv2d").Device(DEVICE_CPU), PruneConv2dOp);
REGISTER_KERNEL_BUILDER(Name("PruneCol2im").Device(DEVICE_CPU), PruneCol2imOp);
