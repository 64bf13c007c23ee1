/* prune's sparse fully-connected kernel for LiteRT (TFLite), as an external delegate (issue 38).
 *
 * Loaded with ai_edge_litert.interpreter.load_delegate(path) (or tf.lite.experimental.load_delegate) and passed
 * as experimental_delegates=[...]; prune.native.litert.delegate_path() builds it. It claims every CUSTOM node
 * whose custom name is "PruneSparseFC" and runs it. No TFLite symbol is linked: the C ABI is declared by hand in
 * litert_abi.h.
 *
 * PruneSparseFC computes y[b, o] = act(bias[o] + sum_k values[k] * x[b, cols[k]]), k in [row_ptr[o], row_ptr[o+1]):
 * a fully-connected layer whose weight W^T ([n_out, n_in]) is stored as CSR by output row. Inputs:
 *   0 x        float32 [..., n_in]  (rank >= 2; the leading dimensions are flattened into rows)
 *   1 values   float32 [nnz]        constant
 *   2 cols     int32   [nnz]        constant, each in [0, n_in)
 *   3 row_ptr  int32   [n_out + 1]  constant, row_ptr[0] == 0, non-decreasing, row_ptr[n_out] == nnz
 *   4 bias     float32 [n_out]      constant, or -1 (no bias), TFLite's optional-tensor index
 * Custom options: 4 bytes {version = 1, activation, keep_num_dims, 0}; activation as TfLiteFusedActivation
 * (0 none, 1 relu, 3 relu6); keep_num_dims as FULLY_CONNECTED's: y is x's shape with the last dimension n_out,
 * else [rows, n_out].
 *
 * Every structure is checked when the node is prepared (allocate_tensors), so a corrupt flatbuffer is refused
 * with a message naming the node and what is wrong, and invoke never reads out of bounds.
 *
 * The kernel has four paths (the delegate option "kernel" forces one for every step: tests and measurements; the
 * default "auto" picks as below). Each sums in another order than a sequential loop (results agree to float
 * rounding; prune_litert_delegate_path() names the vector instruction set compiled in: litert.py builds with
 * -march=native when the compiler takes it).
 *   tile     (auto from 2 rows) x is transposed once per step, by the caller, into tiles of 16 rows ([n_in][16],
 *            while more than 8 rows are left) or 8 rows ([n_in][8], padded with zeros). Per output and tile, each
 *            CSR entry is one broadcast of its value, one vector load of xt[col] (all the tile's rows) and one
 *            fused multiply-add, four independent sums: each entry is read once per 8 or 16 rows, and no gather
 *            is needed. AVX-512F: 16 rows in one zmm; AVX2 + FMA: two ymm; else plain C over the lanes.
 *   dot      per output, a scalar dot product x[col] * value, two outputs interleaved with two sums each, the
 *            columns copied at prepare to 16-bit indices when n_in <= 65536.
 *   gather   per output, the dot product vectorised with gathers of x: AVX-512F 16 entries at a time (two
 *            accumulators at 1 row, masked tail), AVX2 + FMA 8 at a time, up to 4 rows per pass over an output's
 *            entries (sharing the index and value loads); else scalar C.
 *   scatter  along W's rows: y[out] += x[i] * value over the entries of the NONZERO inputs i only (ReLU outputs
 *            are about half zero), from a CSR of W by input row that prepare derives (per thread chunk, output
 *            indices 16-bit when n_out <= 65536); the caller lists the nonzero inputs before the threads start.
 * Auto at 1 row: prepare times the gather, dot and scatter paths on the step's own weights (x all ones, the
 * caller alone, 1 warm-up and 4 timed calls each, alternating, the minimum kept; once per step and thread split),
 * and keeps the faster of gather and dot, and scatter's time per entry relative to it, r. Each call then counts
 * the entries of the nonzero inputs, e (a branch-free pass over x), and takes the scatter path when
 * e * r < nnz, else the faster dot path. The choice thus depends on the timing of one prepare (a loaded machine
 * can flip a close call): the paths differ in float summation order only.
 *
 * Why (issue 38, AMD EPYC Zen 4 VM: family 25 model 17, 2 cores, AVX-512 executed at half width): vector gathers
 * are no faster there than scalar loads, so every batch-1 formulation runs at about one entry per cycle (three
 * loads per entry). A stand-alone C loop over random 90%-sparse layers (1024x2048, 512x2048, 2048x512, 784x300;
 * ns per entry, best of 41): AVX-512 gather 0.41-0.48, AVX2 gather 0.37-0.50, scalar dot 0.37-0.39, the dot
 * path above (16-bit columns, two outputs) 0.31-0.33; scatter 0.42-0.58 per entry READ, so with half the
 * inputs zero it costs 0.24-0.27 per entry of W. The tile path reads an entry once per 8 or 16 rows.
 * Measured in LiteRT (prune.export.to_tflite(kernels="prune"), deploy_speed.py's models at 90%, a call is
 * interpreter.invoke()) on that VM UNDER LOAD (load average 3-8 from other jobs on both cores), ms per call,
 * medians of 15 interleaved rounds, one thread, timed by the calling thread's CPU time (wall time under that
 * load measures the scheduler, not the kernel); before = this file before issue 38's Zen 4 work (AVX-512
 * gather, rows by 4), after = now:
 *            rows:        1                 8                 16
 *   lenet300 784-300-100  0.0137 -> 0.0103  0.1085 -> 0.0192  0.2227 -> 0.0328
 *   mlp1024  1024-2048^2  0.263  -> 0.193   2.33   -> 0.446   4.76   -> 0.824
 *   ffn512   512-2048-512 0.0972 -> 0.0716  0.831  -> 0.141   1.67   -> 0.298
 * Wall time, two threads, same load (noisy; LiteRT dense = XNNPACK, 2 threads): mlp1024 rows 1 0.80 -> 0.37
 * (dense 2.0), rows 8 3.74 -> 0.55 (dense 3.8); ffn512 rows 1 0.26 -> 0.15 (dense 0.15), 16 rows 2.72 -> 0.38
 * (dense 1.06); lenet300 rows 1 0.025 -> 0.016 (dense 0.041), rows 8 0.34 -> 0.034 (dense 0.10). Under that
 * load one thread was faster than two at batch 1 (the pool's thread is often descheduled); a quiet machine is
 * needed to judge the two-thread numbers and issue 38's targets (not measured here).
 *
 * Threads: a step whose work (nnz x passes: its rows, on the tile path its groups of 8 rows) reaches
 * parallel_min_work (default 32768) is split into output ranges of equal cost (nnz + a per-output constant),
 * PRUNE_CHUNKS_PER_THREAD (2) per thread, fixed at prepare; each range writes its own outputs. The caller and the
 * pool's threads claim the ranges one at a time from an atomic counter tagged with the step's generation, so a
 * pool thread that wakes late (descheduled) takes fewer ranges or none and the caller never waits for a thread
 * that has not started, only for ranges already claimed (under load this halved mlp1024's batch-1 time against
 * a fixed range per thread). The steps run one after another. The thread count is the delegate option num_threads
 * when given (load_delegate(path, {"num_threads": "2"})), else the interpreter's (Interpreter(num_threads=N),
 * TfLiteContext.recommended_num_threads), else 1. The threads are a small pool shared by the delegate's partitions
 * (created at prepare, joined when the delegate is destroyed); between jobs they poll for 0.1 ms, then sleep on a
 * condition variable. An interpreter on another thread that shares the delegate runs on its caller alone while
 * the pool is busy.
 *
 * Derived arrays (16-bit columns, the scatter CSR, the tile buffer, the nonzero-input lists) are built at prepare
 * from the checked structures and freed with the partition; invoke allocates nothing.
 *
 * Adjacent claimed nodes form one delegate partition; tensors produced and consumed inside it are not
 * allocated by the interpreter, so the partition kernel owns buffers for them.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <pthread.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "litert_abi.h"

#define PRUNE_EXPORT __attribute__((visibility("default")))
#define PRUNE_MAX_RANK 8
#define PRUNE_MAX_THREADS 64
#define PRUNE_ROW_COST 8        /* cost of one output (bias, horizontal sum, store) in CSR entries, for chunking */
#define PRUNE_SPIN_NS 100000   /* a pool thread (or the caller) polls its flag this long, then sleeps */
#define PRUNE_CHUNKS_PER_THREAD 2 /* a split step's output ranges per thread, claimed one at a time */
#define PRUNE_MAX_CHUNKS (PRUNE_MAX_THREADS * PRUNE_CHUNKS_PER_THREAD)

#if defined(__AVX512F__)
#define PRUNE_PATH "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#define PRUNE_PATH "avx2"
#else
#define PRUNE_PATH "scalar"
#endif

/* TfLiteContext.recommended_num_threads: upstream's common.h declares it right after
 * ReplaceNodeSubsetsWithDelegateKernels, the last member litert_abi.h declares (same layout in TFLite 2.x and
 * LiteRT). It is set by Interpreter(num_threads=N) (-1: not set). */
typedef struct {
  TfLiteContext head;
  int recommended_num_threads;
} ContextWithThreads;
_Static_assert(sizeof(TfLiteContext) == 9 * sizeof(void*), "litert_abi.h's TfLiteContext changed: check the offset");

/* Options of the delegate (tflite_plugin_create_delegate's keys and values). */
typedef struct {
  int num_threads;               /* 0: the interpreter's */
  long long parallel_min_work;   /* a step with fewer nnz x rows runs on one thread */
  int kernel;                    /* kKernelAuto, or the one path every row takes (option "kernel", for tests) */
} Options;

/* The kernel's paths (see the header). */
enum { kKernelAuto = 0, kKernelGather = 1, kKernelDot = 2, kKernelScatter = 3, kKernelTile = 4 };
static const char* const kKernelNames[] = {"auto", "gather", "dot", "scatter", "tile"};
#define PRUNE_TILE_MIN_ROWS 2  /* auto: a step of at least this many rows takes the tile path */

static const char kOpName[] = "PruneSparseFC";
enum { kActNone = 0, kActRelu = 1, kActRelu6 = 3 };

typedef struct {
  int node;                                  /* node index in the execution plan */
  int x, values, cols, row_ptr, bias, out;   /* tensor indices (bias may be -1) */
  int activation, keep_num_dims;
  const char* bad_node;                      /* set when the node's form is wrong: reported at prepare */
  int src;                                   /* step whose internal output is x, or -1 */
  int internal;                              /* output tensor not allocated by the interpreter */
  float* buf;                                /* storage of an internal output */
  size_t rows, n_in, n_out;
  int out_rank;
  int out_dims[PRUNE_MAX_RANK];
  /* Set at prepare (the weights are constant; the derived arrays are kept across prepares while they fit): */
  int chunks;                                /* output ranges the threads split (1: no split) */
  size_t bounds[PRUNE_MAX_CHUNKS + 1];       /* chunk c computes outputs [bounds[c], bounds[c + 1]) */
  int path;                                  /* kKernelTile, or the batch-1 path (kKernelScatter: per call) */
  int fast;                                  /* auto at batch 1: kKernelGather or kKernelDot, the faster dot path */
  double scatter_cost;                       /* auto at batch 1: scatter's time per entry over fast's (timed) */
  float* xt;                                 /* the tile path's transposed input, ceil8(rows) x n_in floats */
  size_t xt_size;
  /* the scatter path: for each chunk c and input i, the entries of W's row i whose output is in chunk c */
  int scatter_chunks;                        /* chunks the arrays below were built for (0: none) */
  int32_t* sptr;                             /* [scatter_chunks][n_in + 1], offsets into sout / sval */
  void* sout;                                /* output indices: uint16_t when n_out <= 65536, else int32_t */
  int s16;
  float* sval;
  int32_t* in_len;                           /* entries of W's row i (all chunks) */
  uint16_t* c16;                             /* cols as 16-bit indices (n_in <= 65536), else NULL */
  int32_t* nz;                               /* the nonzero inputs of each row of x, at invoke (rows x n_in) */
  size_t* nz_n;                              /* their counts per row */
  size_t nz_rows;
} Step;

/* What the partitions of one delegate share (TfLiteDelegate.data_): its options and one thread pool, so that the
 * partitions of a model (separated by ops of other kernels) do not each keep threads polling. */
struct Pool;
typedef struct {
  Options options;
  pthread_mutex_t mu;   /* taken to create or grow the pool */
  struct Pool* pool;    /* NULL until a step needs threads; joined in tflite_plugin_destroy_delegate */
  atomic_int busy;      /* a step runs on the pool (an interpreter on another thread then runs on its own) */
} Shared;

typedef struct {
  int n;
  Step* steps;
  Options options;
  Shared* shared;       /* NULL: a delegate not made by tflite_plugin_create_delegate, no threads */
} Partition;

/* ---- the kernel ------------------------------------------------------------------------------------------ */

/* The arguments of one step, shared by the threads that run it. */
typedef struct {
  const Step* s;
  const float* x;
  const float* values;
  const int32_t* cols;
  const int32_t* rp;
  const float* bias;
  float* y;
  int mode;             /* the path of this call: kKernelGather, kKernelDot, kKernelScatter or kKernelTile */
  int chunks;           /* the threads claim chunks 0..chunks-1 one at a time (pool_run) */
  const size_t* bounds; /* chunk c computes outputs [bounds[c], bounds[c + 1]) */
} Job;

static inline float activate(int activation, float a) {
  if (activation == kActRelu) return a > 0.0f ? a : 0.0f;
  if (activation == kActRelu6) {
    a = a > 0.0f ? a : 0.0f;
    return a < 6.0f ? a : 6.0f;
  }
  return a;
}

/* -- gather: per output, a dot product over its entries with x gathered by vector gathers -- */

/* sums[r] = sum_{k in [k0, k1)} v[k] * x[r * n_in + c[k]] for r < nr (nr in 1..4, a constant after inlining). */
static inline __attribute__((always_inline)) void dots(const int nr, const float* v, const int32_t* c, int32_t k0,
                                                       int32_t k1, const float* x, size_t n_in, float* sums) {
#if defined(__AVX512F__)
  __m512 acc[4], acc2 = _mm512_setzero_ps();
  for (int r = 0; r < nr; ++r) acc[r] = _mm512_setzero_ps();
  int32_t k = k0;
  if (nr == 1) { /* two accumulators: the fused multiply-adds of one row form the only dependency chain */
    for (; k + 32 <= k1; k += 32) {
      __m512i i0 = _mm512_loadu_si512((const void*)(c + k)), i1 = _mm512_loadu_si512((const void*)(c + k + 16));
      acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(v + k), _mm512_i32gather_ps(i0, x, 4), acc[0]);
      acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(v + k + 16), _mm512_i32gather_ps(i1, x, 4), acc2);
    }
  }
  for (; k + 16 <= k1; k += 16) {
    __m512i idx = _mm512_loadu_si512((const void*)(c + k));
    __m512 w = _mm512_loadu_ps(v + k);
    for (int r = 0; r < nr; ++r) acc[r] = _mm512_fmadd_ps(w, _mm512_i32gather_ps(idx, x + r * n_in, 4), acc[r]);
  }
  if (k < k1) { /* 1..15 entries left: lanes past k1 are neither loaded nor gathered */
    __mmask16 m = (__mmask16)((1u << (unsigned)(k1 - k)) - 1u);
    __m512i idx = _mm512_maskz_loadu_epi32(m, (const void*)(c + k));
    __m512 w = _mm512_maskz_loadu_ps(m, v + k);
    for (int r = 0; r < nr; ++r)
      acc[r] = _mm512_fmadd_ps(w, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, x + r * n_in, 4), acc[r]);
  }
  if (nr == 1) acc[0] = _mm512_add_ps(acc[0], acc2);
  for (int r = 0; r < nr; ++r) sums[r] = _mm512_reduce_add_ps(acc[r]);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc[4];
  for (int r = 0; r < nr; ++r) acc[r] = _mm256_setzero_ps();
  int32_t k = k0;
  for (; k + 8 <= k1; k += 8) {
    __m256i idx = _mm256_loadu_si256((const __m256i*)(c + k));
    __m256 w = _mm256_loadu_ps(v + k);
    for (int r = 0; r < nr; ++r) acc[r] = _mm256_fmadd_ps(w, _mm256_i32gather_ps(x + r * n_in, idx, 4), acc[r]);
  }
  if (k < k1) { /* 1..7 entries left: masked loads and gather touch no lane past k1 */
    __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(k1 - k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i idx = _mm256_maskload_epi32((const int*)(c + k), m);
    __m256 w = _mm256_maskload_ps(v + k, m);
    for (int r = 0; r < nr; ++r)
      acc[r] = _mm256_fmadd_ps(
          w, _mm256_mask_i32gather_ps(_mm256_setzero_ps(), x + r * n_in, idx, _mm256_castsi256_ps(m), 4), acc[r]);
  }
  for (int r = 0; r < nr; ++r) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    sums[r] = _mm_cvtss_f32(h);
  }
#else
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int32_t k = k0; k < k1; ++k) {
    const float w = v[k];
    const size_t col = (size_t)c[k];
    for (int r = 0; r < nr; ++r) acc[r] += w * x[r * n_in + col];
  }
  for (int r = 0; r < nr; ++r) sums[r] = acc[r];
#endif
}

/* Rows [b, b + nr) of x, outputs [o0, o1). */
static inline __attribute__((always_inline)) void block(const int nr, const Job* j, size_t b, size_t o0, size_t o1) {
  const Step* s = j->s;
  const size_t n_in = s->n_in, n_out = s->n_out;
  const float* x = j->x + b * n_in;
  float* y = j->y + b * n_out;
  float sums[4];
  for (size_t o = o0; o < o1; ++o) {
    dots(nr, j->values, j->cols, j->rp[o], j->rp[o + 1], x, n_in, sums);
    const float bo = j->bias != NULL ? j->bias[o] : 0.0f;
    for (int r = 0; r < nr; ++r) y[(size_t)r * n_out + o] = activate(s->activation, bo + sums[r]);
  }
}

static void gather_fc(const Job* j, size_t o0, size_t o1) {
  const size_t rows = j->s->rows;
  size_t b = 0;
  for (; b + 4 <= rows; b += 4) block(4, j, b, o0, o1);
  switch (rows - b) {
    case 3: block(3, j, b, o0, o1); break;
    case 2: block(2, j, b, o0, o1); break;
    case 1: block(1, j, b, o0, o1); break;
    default: break;
  }
}

/* -- dot: per output and row, a scalar dot product; two outputs at a time, two sums each (four independent chains),
 * the columns as 16-bit indices when n_in <= 65536 (s->c16); no vector gather -- */

static inline __attribute__((always_inline)) void dot_rows(const int narrow, const Job* j, size_t o0, size_t o1) {
  const Step* s = j->s;
  const size_t n_in = s->n_in, n_out = s->n_out;
  const float* v = j->values;
  const int32_t* rp = j->rp;
  const uint16_t* c16 = s->c16;
  const int32_t* c32 = j->cols;
#define PRUNE_COL(k) (narrow ? (size_t)c16[k] : (size_t)c32[k])
  for (size_t b = 0; b < s->rows; ++b) {
    const float* x = j->x + b * n_in;
    float* y = j->y + b * n_out;
    size_t o = o0;
    for (; o + 2 <= o1; o += 2) {
      int32_t k = rp[o], m = rp[o + 1];
      const int32_t k1 = rp[o + 1], m1 = rp[o + 2];
      float a0 = 0.0f, a1 = 0.0f, b0 = 0.0f, b1 = 0.0f;
      for (; k + 2 <= k1 && m + 2 <= m1; k += 2, m += 2) {
        a0 += v[k] * x[PRUNE_COL(k)];
        a1 += v[k + 1] * x[PRUNE_COL(k + 1)];
        b0 += v[m] * x[PRUNE_COL(m)];
        b1 += v[m + 1] * x[PRUNE_COL(m + 1)];
      }
      for (; k + 2 <= k1; k += 2) {
        a0 += v[k] * x[PRUNE_COL(k)];
        a1 += v[k + 1] * x[PRUNE_COL(k + 1)];
      }
      for (; m + 2 <= m1; m += 2) {
        b0 += v[m] * x[PRUNE_COL(m)];
        b1 += v[m + 1] * x[PRUNE_COL(m + 1)];
      }
      if (k < k1) a0 += v[k] * x[PRUNE_COL(k)];
      if (m < m1) b0 += v[m] * x[PRUNE_COL(m)];
      y[o] = activate(s->activation, (j->bias != NULL ? j->bias[o] : 0.0f) + (a0 + a1));
      y[o + 1] = activate(s->activation, (j->bias != NULL ? j->bias[o + 1] : 0.0f) + (b0 + b1));
    }
    if (o < o1) {
      int32_t k = rp[o];
      const int32_t k1 = rp[o + 1];
      float a0 = 0.0f, a1 = 0.0f;
      for (; k + 2 <= k1; k += 2) {
        a0 += v[k] * x[PRUNE_COL(k)];
        a1 += v[k + 1] * x[PRUNE_COL(k + 1)];
      }
      if (k < k1) a0 += v[k] * x[PRUNE_COL(k)];
      y[o] = activate(s->activation, (j->bias != NULL ? j->bias[o] : 0.0f) + (a0 + a1));
    }
  }
#undef PRUNE_COL
}

static void dot_fc(const Job* j, size_t o0, size_t o1) {
  if (j->s->c16 != NULL) dot_rows(1, j, o0, o1);
  else dot_rows(0, j, o0, o1);
}

/* -- scatter: along W's rows, y[out] += x[i] * value over the entries of the nonzero inputs i only -- */

/* The entries the scatter path reads for x: those of its nonzero inputs (sum of in_len over them, all rows). A
 * loop without branches, which the compiler vectorises: auto runs it on every call at batch 1. */
static size_t scatter_work(const Step* s, const float* x) {
  size_t work = 0;
  for (size_t b = 0; b < s->rows; ++b) {
    const float* xb = x + b * s->n_in;
    int32_t w = 0; /* sum of in_len <= nnz < 2^31 */
    for (size_t i = 0; i < s->n_in; ++i) w += xb[i] != 0.0f ? s->in_len[i] : 0;
    work += (size_t)w;
  }
  return work;
}

/* The nonzero inputs of each row of x into s->nz (the caller, before the threads start). */
static void scatter_lists(Step* s, const float* x) {
  for (size_t b = 0; b < s->rows; ++b) {
    const float* xb = x + b * s->n_in;
    int32_t* list = s->nz + b * s->n_in;
    size_t n = 0;
    for (size_t i = 0; i < s->n_in; ++i) { /* branch-free: ReLU outputs are zero at random */
      list[n] = (int32_t)i;
      n += xb[i] != 0.0f;
    }
    s->nz_n[b] = n;
  }
}

static inline __attribute__((always_inline)) void scatter_row(const int narrow, const Step* s, int c, const float* x,
                                                              const int32_t* list, size_t n, float* y) {
  const int32_t* ptr = s->sptr + (size_t)c * (s->n_in + 1);
  const uint16_t* o16 = (const uint16_t*)s->sout;
  const int32_t* o32 = (const int32_t*)s->sout;
  const float* v = s->sval;
  for (size_t q = 0; q < n; ++q) {
    const int32_t i = list[q];
    const float xi = x[i];
    const int32_t k1 = ptr[i + 1];
    for (int32_t k = ptr[i]; k < k1; ++k) {
      const size_t o = narrow ? (size_t)o16[k] : (size_t)o32[k];
      y[o] += xi * v[k];
    }
  }
}

/* Chunk c (outputs [bounds[c], bounds[c + 1])) of every row; s->nz holds the nonzero inputs. */
static void scatter_fc(const Job* j, int c) {
  const Step* s = j->s;
  const size_t o0 = j->bounds[c], o1 = j->bounds[c + 1];
  for (size_t b = 0; b < s->rows; ++b) {
    float* y = j->y + b * s->n_out;
    const float* x = j->x + b * s->n_in;
    for (size_t o = o0; o < o1; ++o) y[o] = 0.0f;
    if (s->s16) scatter_row(1, s, c, x, s->nz + b * s->n_in, s->nz_n[b], y);
    else scatter_row(0, s, c, x, s->nz + b * s->n_in, s->nz_n[b], y);
    for (size_t o = o0; o < o1; ++o) y[o] = activate(s->activation, (j->bias != NULL ? j->bias[o] : 0.0f) + y[o]);
  }
}

/* -- tile: x transposed once per step into tiles [n_in][8 or 16 rows]; per output, each entry is one broadcast of
 * its value, one vector load of its input for all the tile's rows and one fused multiply-add (no gather) -- */

/* Transposes rows [b0, b0 + n) of x into xt ([n_in][tw], rows past n zero). */
static void transpose_tile(const float* x, size_t n_in, size_t b0, size_t n, int tw, float* xt) {
  for (size_t i = 0; i < n_in; ++i) {
    float* t = xt + i * (size_t)tw;
    size_t r = 0;
    for (; r < n; ++r) t[r] = x[(b0 + r) * n_in + i];
    for (; r < (size_t)tw; ++r) t[r] = 0.0f;
  }
}

/* The tiles of a step of `rows` rows: 16 rows each while more than 8 are left, then one of 8 (both padded). */
static inline int tile_width(size_t left) { return left > 8 ? 16 : 8; }

/* sums[0..tw) = sum_{k in [k0, k1)} v[k] * xt[col(k) * tw + (0..tw)], col(k) from c16 (narrow) or c32 */
static inline __attribute__((always_inline)) void tile_dot(const int tw, const int narrow, const float* v,
                                                           const uint16_t* c16, const int32_t* c32, int32_t k0,
                                                           int32_t k1, const float* xt, float* sums) {
#define PRUNE_TCOL(k) (narrow ? (size_t)c16[k] : (size_t)c32[k])
#if defined(__AVX512F__)
  if (tw == 16) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int32_t k = k0;
    for (; k + 4 <= k1; k += 4) {
      a0 = _mm512_fmadd_ps(_mm512_set1_ps(v[k]), _mm512_loadu_ps(xt + PRUNE_TCOL(k) * 16), a0);
      a1 = _mm512_fmadd_ps(_mm512_set1_ps(v[k + 1]), _mm512_loadu_ps(xt + PRUNE_TCOL(k + 1) * 16), a1);
      a2 = _mm512_fmadd_ps(_mm512_set1_ps(v[k + 2]), _mm512_loadu_ps(xt + PRUNE_TCOL(k + 2) * 16), a2);
      a3 = _mm512_fmadd_ps(_mm512_set1_ps(v[k + 3]), _mm512_loadu_ps(xt + PRUNE_TCOL(k + 3) * 16), a3);
    }
    for (; k < k1; ++k) a0 = _mm512_fmadd_ps(_mm512_set1_ps(v[k]), _mm512_loadu_ps(xt + PRUNE_TCOL(k) * 16), a0);
    _mm512_storeu_ps(sums, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    return;
  }
#endif
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  if (tw == 16) { /* AVX2: two 8-lane halves, two entries at a time */
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
    int32_t k = k0;
    for (; k + 2 <= k1; k += 2) {
      const float* p = xt + PRUNE_TCOL(k) * 16;
      const float* q = xt + PRUNE_TCOL(k + 1) * 16;
      const __m256 w = _mm256_set1_ps(v[k]), u = _mm256_set1_ps(v[k + 1]);
      a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(p), a0);
      a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(p + 8), a1);
      b0 = _mm256_fmadd_ps(u, _mm256_loadu_ps(q), b0);
      b1 = _mm256_fmadd_ps(u, _mm256_loadu_ps(q + 8), b1);
    }
    if (k < k1) {
      const float* p = xt + PRUNE_TCOL(k) * 16;
      const __m256 w = _mm256_set1_ps(v[k]);
      a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(p), a0);
      a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(p + 8), a1);
    }
    _mm256_storeu_ps(sums, _mm256_add_ps(a0, b0));
    _mm256_storeu_ps(sums + 8, _mm256_add_ps(a1, b1));
  } else {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int32_t k = k0;
    for (; k + 4 <= k1; k += 4) {
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(v[k]), _mm256_loadu_ps(xt + PRUNE_TCOL(k) * 8), a0);
      a1 = _mm256_fmadd_ps(_mm256_set1_ps(v[k + 1]), _mm256_loadu_ps(xt + PRUNE_TCOL(k + 1) * 8), a1);
      a2 = _mm256_fmadd_ps(_mm256_set1_ps(v[k + 2]), _mm256_loadu_ps(xt + PRUNE_TCOL(k + 2) * 8), a2);
      a3 = _mm256_fmadd_ps(_mm256_set1_ps(v[k + 3]), _mm256_loadu_ps(xt + PRUNE_TCOL(k + 3) * 8), a3);
    }
    for (; k < k1; ++k) a0 = _mm256_fmadd_ps(_mm256_set1_ps(v[k]), _mm256_loadu_ps(xt + PRUNE_TCOL(k) * 8), a0);
    _mm256_storeu_ps(sums, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  }
#else
  float acc[16] = {0.0f};
  for (int32_t k = k0; k < k1; ++k) {
    const float w = v[k];
    const float* p = xt + PRUNE_TCOL(k) * (size_t)tw;
    for (int r = 0; r < tw; ++r) acc[r] += w * p[r];
  }
  for (int r = 0; r < tw; ++r) sums[r] = acc[r];
#endif
#undef PRUNE_TCOL
}

static inline __attribute__((always_inline)) void tile_block(const int tw, const int narrow, const Job* j, size_t b0,
                                                             size_t n, size_t o0, size_t o1) {
  const Step* s = j->s;
  const size_t n_out = s->n_out;
  const float* xt = s->xt + b0 * s->n_in;
  float* y = j->y + b0 * n_out;
  float sums[16];
  for (size_t o = o0; o < o1; ++o) {
    tile_dot(tw, narrow, j->values, s->c16, j->cols, j->rp[o], j->rp[o + 1], xt, sums);
    const float bo = j->bias != NULL ? j->bias[o] : 0.0f;
    for (size_t r = 0; r < n; ++r) y[r * n_out + o] = activate(s->activation, bo + sums[r]);
  }
}

/* Outputs [o0, o1) of every row; s->xt holds the transposed tiles. */
static void tile_fc(const Job* j, size_t o0, size_t o1) {
  const size_t rows = j->s->rows;
  for (size_t b0 = 0; b0 < rows;) {
    const int tw = tile_width(rows - b0);
    const size_t n = rows - b0 < (size_t)tw ? rows - b0 : (size_t)tw;
    const int narrow = j->s->c16 != NULL;
    if (tw == 16 && narrow) tile_block(16, 1, j, b0, n, o0, o1);
    else if (tw == 16) tile_block(16, 0, j, b0, n, o0, o1);
    else if (narrow) tile_block(8, 1, j, b0, n, o0, o1);
    else tile_block(8, 0, j, b0, n, o0, o1);
    b0 += n;
  }
}

/* The caller's part before the threads start: x into tiles. */
static void tile_prepare_input(Step* s, const float* x) {
  for (size_t b0 = 0; b0 < s->rows;) {
    const int tw = tile_width(s->rows - b0);
    const size_t n = s->rows - b0 < (size_t)tw ? s->rows - b0 : (size_t)tw;
    transpose_tile(x, s->n_in, b0, n, tw, s->xt + b0 * s->n_in);
    b0 += n;
  }
}

/* Chunk c of the job, by its path. */
static void run_chunk(const Job* j, int c) {
  const size_t o0 = j->bounds[c], o1 = j->bounds[c + 1];
  switch (j->mode) {
    case kKernelTile: tile_fc(j, o0, o1); break;
    case kKernelScatter: scatter_fc(j, c); break;
    case kKernelDot: dot_fc(j, o0, o1); break;
    default: gather_fc(j, o0, o1); break;
  }
}

/* Splits the outputs into `chunks` ranges of about equal cost rp[o] + PRUNE_ROW_COST * o. */
static void chunk(const int32_t* rp, size_t n_out, int chunks, size_t* bounds) {
  const double total = (double)rp[n_out] + (double)PRUNE_ROW_COST * (double)n_out;
  bounds[0] = 0;
  for (int t = 1; t < chunks; ++t) {
    const double want = total * t / chunks;
    size_t lo = bounds[t - 1], hi = n_out; /* the first o in [lo, hi] whose cost reaches want */
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if ((double)rp[mid] + (double)PRUNE_ROW_COST * (double)mid < want) lo = mid + 1;
      else hi = mid;
    }
    bounds[t] = lo;
  }
  bounds[chunks] = n_out;
}

/* ---- the thread pool ------------------------------------------------------------------------------------- */

typedef struct Pool {
  int n;                     /* threads besides the caller */
  pthread_t tids[PRUNE_MAX_THREADS];
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  atomic_uint gen;           /* bumped (under mu) for each job and to stop */
  atomic_ullong work;        /* (gen << 32) | (chunks << 16) | the next chunk to claim, of the current job */
  atomic_int finished;       /* chunks of the current job finished */
  atomic_int stop;
  pid_t pid;                 /* the process whose threads these are: a fork()ed child has none of them */
  Job job;
} Pool;

typedef struct {
  Pool* pool;
  int id;                    /* 1..n; the caller is 0 */
} WorkerArg;

static atomic_ullong g_parallel_runs;  /* steps run on several threads (for the tests) */
static atomic_int g_last_threads;      /* threads of the last step run */
static atomic_int g_last_path;         /* path of the last step run (kKernel*) */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Called in a polling loop: false once the loop has polled for PRUNE_SPIN_NS (then the caller sleeps). The clock
 * is read every 64 polls. */
static inline int keep_spinning(int* polls, long long* since) {
  if ((++*polls & 63) != 0) {
    cpu_relax();
    return 1;
  }
  long long t = now_ns();
  if (*since == 0) *since = t;
  return t - *since < PRUNE_SPIN_NS;
}

/* Claims and runs chunks of job `g` until none is left (or the job is no longer `g`: a thread that woke late). Whoever
 * finishes the last chunk wakes the caller if it sleeps. */
static void claim_and_run(Pool* p, unsigned g) {
  for (;;) {
    unsigned long long w = atomic_load_explicit(&p->work, memory_order_acquire);
    const unsigned next = (unsigned)(w & 0xffffu), chunks = (unsigned)((w >> 16) & 0xffffu);
    if ((unsigned)(w >> 32) != g || next >= chunks) return;
    if (!atomic_compare_exchange_weak_explicit(&p->work, &w, w + 1, memory_order_acq_rel, memory_order_acquire))
      continue;
    run_chunk(&p->job, (int)next); /* p->job stays as it is until every chunk is finished */
    if (atomic_fetch_add_explicit(&p->finished, 1, memory_order_acq_rel) + 1 == (int)chunks) {
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->done);
      pthread_mutex_unlock(&p->mu);
    }
  }
}

static void* worker(void* arg) {
  WorkerArg* a = (WorkerArg*)arg;
  Pool* p = a->pool;
  free(a);
  unsigned seen = 0;
  for (;;) {
    unsigned g;
    int polls = 0;
    long long since = 0;
    while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
      if (keep_spinning(&polls, &since)) continue;
      pthread_mutex_lock(&p->mu);
      while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen) pthread_cond_wait(&p->wake, &p->mu);
      pthread_mutex_unlock(&p->mu);
    }
    seen = g;
    if (atomic_load_explicit(&p->stop, memory_order_acquire)) return NULL;
    claim_and_run(p, g);
  }
}

static void pool_destroy(Pool* p) {
  if (p == NULL) return;
  if (p->pid != getpid()) { /* inherited through fork(): its threads are not in this process, nothing to join */
    free(p);
    return;
  }
  pthread_mutex_lock(&p->mu);
  atomic_store_explicit(&p->stop, 1, memory_order_release);
  atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n; ++i) pthread_join(p->tids[i], NULL);
  pthread_cond_destroy(&p->wake);
  pthread_cond_destroy(&p->done);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

/* A pool of `n` threads besides the caller, or NULL when none can be started. */
static Pool* pool_create(int n) {
  Pool* p = (Pool*)calloc(1, sizeof(Pool));
  if (p == NULL) return NULL;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->done, NULL);
  atomic_init(&p->gen, 0u);
  atomic_init(&p->work, 0ull);
  atomic_init(&p->finished, 0);
  atomic_init(&p->stop, 0);
  p->pid = getpid();
  for (int i = 0; i < n; ++i) {
    WorkerArg* a = (WorkerArg*)malloc(sizeof(WorkerArg));
    if (a == NULL) break;
    a->pool = p;
    a->id = i + 1;
    if (pthread_create(&p->tids[i], NULL, worker, a) != 0) {
      free(a);
      break;
    }
    p->n = i + 1;
  }
  if (p->n == 0) {
    pool_destroy(p);
    return NULL;
  }
  return p;
}

/* Runs the p->job.chunks chunks of p->job (set by the caller) on the pool and the caller; returns when all are
 * finished. The chunks are claimed one at a time (an atomic counter tagged with the job's generation), so a pool
 * thread that wakes late (descheduled: another process, a busy VM) takes fewer chunks or none, and the caller
 * never waits for a thread that has not started: it waits only for chunks already claimed. */
static void pool_run(Pool* p) {
  const int chunks = p->job.chunks;
  atomic_store_explicit(&p->finished, 0, memory_order_relaxed);
  const unsigned g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1u;
  atomic_store_explicit(&p->work, ((unsigned long long)g << 32) | ((unsigned long long)chunks << 16),
                        memory_order_release);
  pthread_mutex_lock(&p->mu);
  atomic_store_explicit(&p->gen, g, memory_order_release);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  claim_and_run(p, g);
  int polls = 0;
  long long since = 0;
  while (atomic_load_explicit(&p->finished, memory_order_acquire) < chunks) {
    if (keep_spinning(&polls, &since)) continue;
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->finished, memory_order_acquire) < chunks) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
  }
}

static int pool_threads(const Pool* p) { return p != NULL ? p->n + 1 : 1; }

/* Whether `p`'s threads run in this process (not in the parent of a fork()ed child, where a job would wait forever). */
static int pool_here(const Pool* p) { return p != NULL && p->pid == getpid(); }

/* The threads to use: the delegate's num_threads option, else the interpreter's, else 1 (at most
 * PRUNE_MAX_THREADS). */
static int wanted_threads(TfLiteContext* ctx, const Options* o) {
  int t = o->num_threads > 0 ? o->num_threads : ((const ContextWithThreads*)ctx)->recommended_num_threads;
  if (t < 1) t = 1;
  return t > PRUNE_MAX_THREADS ? PRUNE_MAX_THREADS : t;
}

static int contains(const TfLiteIntArray* a, int v) {
  for (int i = 0; i < a->size; ++i)
    if (a->data[i] == v) return 1;
  return 0;
}

static const char* tensor_name(TfLiteContext* ctx, int t) {
  if (t < 0 || (size_t)t >= ctx->tensors_size || ctx->tensors[t].name == NULL) return "?";
  return ctx->tensors[t].name;
}

static void* k_init(TfLiteContext* ctx, const char* buffer, size_t length) {
  (void)length;
  const TfLiteDelegateParams* p = (const TfLiteDelegateParams*)buffer;
  Partition* part = (Partition*)calloc(1, sizeof(Partition));
  if (part == NULL) return NULL;
  int count = p->nodes_to_replace->size;
  part->steps = (Step*)calloc((size_t)(count > 0 ? count : 1), sizeof(Step));
  if (part->steps == NULL) {
    free(part);
    return NULL;
  }
  part->options.parallel_min_work = 32768;
  if (p->delegate != NULL && p->delegate->data_ != NULL) {
    part->shared = (Shared*)p->delegate->data_;
    part->options = part->shared->options;
  }
  for (int i = 0; i < count; ++i) {
    Step* s = &part->steps[part->n++];
    TfLiteNode* node;
    TfLiteRegistration* reg;
    s->node = p->nodes_to_replace->data[i];
    s->src = -1;
    s->x = s->values = s->cols = s->row_ptr = s->bias = s->out = -1;
    if (ctx->GetNodeAndRegistration(ctx, s->node, &node, &reg) != kTfLiteOk) {
      s->bad_node = "its node cannot be read";
      continue;
    }
    if (node->inputs->size != 5 || node->outputs->size != 1) {
      s->bad_node = "it must have 5 inputs (x, values, cols, row_ptr, bias or -1) and 1 output";
      continue;
    }
    s->x = node->inputs->data[0];
    s->values = node->inputs->data[1];
    s->cols = node->inputs->data[2];
    s->row_ptr = node->inputs->data[3];
    s->bias = node->inputs->data[4];
    s->out = node->outputs->data[0];
    const unsigned char* opt = (const unsigned char*)node->custom_initial_data;
    if (opt == NULL || node->custom_initial_data_size != 4 || opt[0] != 1 || opt[3] != 0 ||
        !(opt[1] == kActNone || opt[1] == kActRelu || opt[1] == kActRelu6) || opt[2] > 1) {
      s->bad_node = "its custom options must be the 4 bytes {1, activation (0, 1 or 3), keep_num_dims (0 or 1), 0}";
      continue;
    }
    s->activation = opt[1];
    s->keep_num_dims = opt[2];
    s->internal = !contains(p->output_tensors, s->out);
    for (int j = 0; j < i; ++j)
      if (part->steps[j].internal && part->steps[j].out == s->x) s->src = j;
  }
  return part;
}

static void k_free(TfLiteContext* ctx, void* buffer) {
  (void)ctx;
  Partition* part = (Partition*)buffer;
  if (part == NULL) return;
  for (int i = 0; i < part->n; ++i) {
    Step* s = &part->steps[i];
    free(s->buf);
    free(s->xt);
    free(s->sptr);
    free(s->sout);
    free(s->sval);
    free(s->in_len);
    free(s->c16);
    free(s->nz);
    free(s->nz_n);
  }
  free(part->steps);
  free(part);
}

#define FAIL(...)                                                                                     \
  do {                                                                                                \
    char what_[512];                                                                                  \
    snprintf(what_, sizeof(what_), __VA_ARGS__);                                                      \
    ctx->ReportError(ctx, "PruneSparseFC node %d (output '%s'): %s", s->node, tensor_name(ctx, s->out), \
                     what_);                                                                          \
    return kTfLiteError;                                                                              \
  } while (0)

/* A constant rank-1 tensor of `type` whose data holds exactly dims[0] elements of `size` bytes. */
static const char* check_vector(TfLiteContext* ctx, int t, TfLiteType type, size_t size, size_t* length) {
  if (t < 0 || (size_t)t >= ctx->tensors_size) return "is missing";
  const TfLiteTensor* v = &ctx->tensors[t];
  if (v->type != type) return type == kTfLiteFloat32 ? "must be float32" : "must be int32";
  if (v->dims == NULL || v->dims->size != 1 || v->dims->data[0] < 0) return "must be a vector (rank 1)";
  if (v->allocation_type != kTfLiteMmapRo) return "must be a constant tensor of the model";
  *length = (size_t)v->dims->data[0];
  if (v->bytes != *length * size) return "holds another number of bytes than its shape says";
  if (*length > 0 && v->data.data == NULL) return "has no data";
  return NULL;
}

static TfLiteStatus prepare_step(TfLiteContext* ctx, Partition* part, Step* s) {
  if (s->bad_node != NULL) FAIL("%s", s->bad_node);
  /* x: its shape comes from the interpreter, or from the step of this partition that computes it */
  int rank;
  const int* dims;
  if (s->src >= 0) {
    rank = part->steps[s->src].out_rank;
    dims = part->steps[s->src].out_dims;
  } else {
    if (s->x < 0 || (size_t)s->x >= ctx->tensors_size) FAIL("input x is missing");
    const TfLiteTensor* x = &ctx->tensors[s->x];
    if (x->type != kTfLiteFloat32) FAIL("input x ('%s') must be float32", tensor_name(ctx, s->x));
    if (x->dims == NULL) FAIL("input x ('%s') has no shape", tensor_name(ctx, s->x));
    rank = x->dims->size;
    dims = x->dims->data;
  }
  if (rank < 2 || rank > PRUNE_MAX_RANK) FAIL("input x must have rank 2 to %d, got %d", PRUNE_MAX_RANK, rank);
  size_t rows = 1;
  for (int d = 0; d < rank; ++d) {
    if (dims[d] < 0) FAIL("input x has a negative dimension %d", dims[d]);
    if (d < rank - 1) {
      if (dims[d] > 0 && rows > ((size_t)1 << 40) / (size_t)dims[d]) FAIL("input x is too large");
      rows *= (size_t)dims[d];
    }
  }
  size_t n_in = (size_t)dims[rank - 1];
  size_t nnz, ncols, nrp, nbias;
  const char* why;
  if ((why = check_vector(ctx, s->values, kTfLiteFloat32, sizeof(float), &nnz)) != NULL) FAIL("values %s", why);
  if ((why = check_vector(ctx, s->cols, kTfLiteInt32, sizeof(int32_t), &ncols)) != NULL) FAIL("cols %s", why);
  if ((why = check_vector(ctx, s->row_ptr, kTfLiteInt32, sizeof(int32_t), &nrp)) != NULL) FAIL("row_ptr %s", why);
  if (ncols != nnz) FAIL("cols holds %zu entries but values %zu", ncols, nnz);
  if (nrp < 1) FAIL("row_ptr must hold n_out + 1 >= 1 entries, got 0");
  size_t n_out = nrp - 1;
  if (s->bias != kTfLiteOptionalTensor) {
    if ((why = check_vector(ctx, s->bias, kTfLiteFloat32, sizeof(float), &nbias)) != NULL) FAIL("bias %s", why);
    if (nbias != n_out) FAIL("bias holds %zu entries but row_ptr says n_out = %zu", nbias, n_out);
  }
  const int32_t* rp = ctx->tensors[s->row_ptr].data.i32;
  const int32_t* cols = ctx->tensors[s->cols].data.i32;
  if (rp[0] != 0) FAIL("row_ptr[0] must be 0, got %d", (int)rp[0]);
  for (size_t o = 0; o < n_out; ++o)
    if (rp[o + 1] < rp[o])
      FAIL("row_ptr decreases at output %zu (row_ptr[%zu] = %d > row_ptr[%zu] = %d)", o, o, (int)rp[o], o + 1,
           (int)rp[o + 1]);
  if ((size_t)rp[n_out] != nnz) FAIL("row_ptr[n_out] = row_ptr[%zu] = %d must equal nnz = %zu", n_out, (int)rp[n_out], nnz);
  for (size_t k = 0; k < nnz; ++k)
    if (cols[k] < 0 || (size_t)cols[k] >= n_in)
      FAIL("cols[%zu] = %d is outside [0, n_in = %zu) (n_in is x's last dimension)", k, (int)cols[k], n_in);
  if (n_out > 0 && rows > ((size_t)1 << 40) / n_out) FAIL("the output is too large");
  s->rows = rows;
  s->n_in = n_in;
  s->n_out = n_out;
  if (n_out > 0x7fffffff) FAIL("n_out is too large");
  if (s->keep_num_dims) {
    s->out_rank = rank;
    for (int d = 0; d < rank - 1; ++d) s->out_dims[d] = dims[d];
  } else {
    if (rows > 0x7fffffff) FAIL("the output is too large");
    s->out_rank = 2;
    s->out_dims[0] = (int)rows;
  }
  s->out_dims[s->out_rank - 1] = (int)n_out;
  if (s->internal) {
    free(s->buf);
    s->buf = (float*)malloc((rows * n_out > 0 ? rows * n_out : 1) * sizeof(float));
    if (s->buf == NULL) FAIL("out of memory for an intermediate of %zu x %zu floats", rows, n_out);
    return kTfLiteOk;
  }
  if (s->out < 0 || (size_t)s->out >= ctx->tensors_size) FAIL("output is missing");
  if (ctx->tensors[s->out].type != kTfLiteFloat32) FAIL("output must be float32");
  TfLiteIntArray* shape = (TfLiteIntArray*)malloc(sizeof(int) * (size_t)(s->out_rank + 1));
  if (shape == NULL) FAIL("out of memory");
  shape->size = s->out_rank;
  memcpy(shape->data, s->out_dims, sizeof(int) * (size_t)s->out_rank);
  if (ctx->ResizeTensor(ctx, &ctx->tensors[s->out], shape) != kTfLiteOk) FAIL("the output cannot be resized");
  return kTfLiteOk;
}

/* The scatter path's arrays (CSR of W by input row, per chunk), for s->chunks chunks; kept while they fit. */
static TfLiteStatus prepare_scatter(TfLiteContext* ctx, Step* s, const int32_t* rp, const int32_t* cols,
                                    const float* values) {
  const size_t n_in = s->n_in, n_out = s->n_out, nnz = (size_t)rp[n_out];
  if (s->nz_rows != s->rows) {
    free(s->nz);
    free(s->nz_n);
    s->nz = (int32_t*)malloc((s->rows * n_in > 0 ? s->rows * n_in : 1) * sizeof(int32_t));
    s->nz_n = (size_t*)malloc((s->rows > 0 ? s->rows : 1) * sizeof(size_t));
    s->nz_rows = s->nz == NULL || s->nz_n == NULL ? 0 : s->rows;
    if (s->nz_rows != s->rows) FAIL("out of memory for the scatter path's input lists (%zu x %zu)", s->rows, n_in);
  }
  if (s->scatter_chunks == s->chunks) return kTfLiteOk;
  const int chunks = s->chunks;
  free(s->sptr);
  free(s->sout);
  free(s->sval);
  free(s->in_len);
  s->scatter_chunks = 0;
  s->s16 = n_out <= 65536;
  s->sptr = (int32_t*)calloc((size_t)chunks * (n_in + 1), sizeof(int32_t));
  s->sout = malloc((nnz > 0 ? nnz : 1) * (s->s16 ? sizeof(uint16_t) : sizeof(int32_t)));
  s->sval = (float*)malloc((nnz > 0 ? nnz : 1) * sizeof(float));
  s->in_len = (int32_t*)calloc(n_in > 0 ? n_in : 1, sizeof(int32_t));
  int32_t* fill = (int32_t*)malloc((n_in > 0 ? n_in : 1) * sizeof(int32_t));
  if (s->sptr == NULL || s->sout == NULL || s->sval == NULL || s->in_len == NULL || fill == NULL) {
    free(fill);
    FAIL("out of memory for the scatter path's arrays (%zu entries)", nnz);
  }
  for (int c = 0; c < chunks; ++c) { /* counts, then offsets: chunk by chunk, input by input */
    int32_t* ptr = s->sptr + (size_t)c * (n_in + 1);
    for (size_t o = s->bounds[c]; o < s->bounds[c + 1]; ++o)
      for (int32_t k = rp[o]; k < rp[o + 1]; ++k) ptr[cols[k] + 1]++;
    ptr[0] = c == 0 ? 0 : s->sptr[(size_t)c * (n_in + 1) - 1];
    for (size_t i = 0; i < n_in; ++i) {
      s->in_len[i] += ptr[i + 1];
      ptr[i + 1] += ptr[i];
    }
    memcpy(fill, ptr, n_in * sizeof(int32_t));
    for (size_t o = s->bounds[c]; o < s->bounds[c + 1]; ++o)
      for (int32_t k = rp[o]; k < rp[o + 1]; ++k) {
        const int32_t at = fill[cols[k]]++;
        if (s->s16) ((uint16_t*)s->sout)[at] = (uint16_t)o;
        else ((int32_t*)s->sout)[at] = (int32_t)o;
        s->sval[at] = values[k];
      }
  }
  free(fill);
  s->scatter_chunks = chunks;
  return kTfLiteOk;
}

/* Auto at batch 1: times the dot paths (vector gather, scalar) and the scatter path (every input nonzero) on the
 * step's own weights, alternating, on the caller alone; keeps the faster dot path and scatter's cost relative to it.
 * Once per step (the weights are constant). */
static void time_batch1_paths(Step* s, const float* values, const int32_t* cols, const int32_t* rp) {
  float* x = (float*)malloc((s->n_in > 0 ? s->n_in : 1) * sizeof(float));
  float* y = (float*)malloc((s->n_out > 0 ? s->n_out : 1) * sizeof(float));
  s->fast = kKernelDot;
  s->scatter_cost = 1.0;
  if (x == NULL || y == NULL) {
    free(x);
    free(y);
    return;
  }
  for (size_t i = 0; i < s->n_in; ++i) x[i] = 1.0f;
  Job j = {s, x, values, cols, rp, NULL, y, kKernelDot, s->chunks, s->bounds};
  const int paths[3] = {kKernelGather, kKernelDot, kKernelScatter};
  long long best[3] = {-1, -1, -1};
  int reps = 5;
  for (int r = 0; r < reps; ++r)
    for (int p = 0; p < 3; ++p) {
#if !defined(__AVX512F__) && !(defined(__AVX2__) && defined(__FMA__))
      if (paths[p] == kKernelGather) continue; /* the scalar build's gather is the dot path */
#endif
      j.mode = paths[p];
      const long long t0 = now_ns();
      if (j.mode == kKernelScatter) scatter_lists(s, x);
      for (int c = 0; c < j.chunks; ++c) run_chunk(&j, c);
      const long long t = now_ns() - t0;
      if (r == 0) { /* the first round warms the caches; a slow layer is timed once more only */
        if (t > 20000000LL) reps = 2;
        continue;
      }
      if (best[p] < 0 || t < best[p]) best[p] = t;
    }
  const long long fast = best[0] >= 0 && best[0] < best[1] ? best[0] : best[1];
  s->fast = best[0] >= 0 && best[0] < best[1] ? kKernelGather : kKernelDot;
  if (fast > 0 && best[2] > 0) s->scatter_cost = (double)best[2] / (double)fast;
  free(x);
  free(y);
}

static TfLiteStatus prepare_paths(TfLiteContext* ctx, Partition* part, Step* s, int threads) {
  const int32_t* rp = ctx->tensors[s->row_ptr].data.i32;
  const int32_t* cols = ctx->tensors[s->cols].data.i32;
  const float* values = ctx->tensors[s->values].data.f;
  const size_t nnz = (size_t)rp[s->n_out];
  if (s->c16 == NULL && s->n_in <= 65536) { /* the columns were checked to be in [0, n_in) */
    s->c16 = (uint16_t*)malloc((nnz > 0 ? nnz : 1) * sizeof(uint16_t));
    if (s->c16 == NULL) FAIL("out of memory for the 16-bit column indices (%zu entries)", nnz);
    for (size_t k = 0; k < nnz; ++k) s->c16[k] = (uint16_t)cols[k];
  }
  const int kernel = part->options.kernel;
  s->path = kernel != kKernelAuto ? kernel : s->rows >= PRUNE_TILE_MIN_ROWS ? kKernelTile : kKernelScatter;
  /* the work: entries x passes over them (the tile path reads each entry once per tile of up to 8 or 16 rows) */
  const long long passes = s->path == kKernelTile ? (long long)((s->rows + 7) / 8) : (long long)s->rows;
  const long long work = (long long)rp[s->n_out] * passes;
  int chunks = part->shared != NULL && threads > 1 && work >= part->options.parallel_min_work
                   ? threads * PRUNE_CHUNKS_PER_THREAD : 1;
  if ((size_t)chunks > s->n_out) chunks = s->n_out > 0 ? (int)s->n_out : 1;
  if (chunks != s->chunks) {
    s->chunks = chunks;
    chunk(rp, s->n_out, chunks, s->bounds);
  }
  if (s->path == kKernelTile) {
    const size_t need = ((s->rows + 7) / 8) * 8 * s->n_in;
    if (need > s->xt_size) {
      free(s->xt);
      s->xt_size = 0;
      s->xt = (float*)malloc(need * sizeof(float));
      if (s->xt == NULL) FAIL("out of memory for the tile path's transposed input (%zu floats)", need);
      s->xt_size = need;
    }
  }
  if (s->path == kKernelScatter) {
    const int had = s->scatter_chunks;
    if (prepare_scatter(ctx, s, rp, cols, values) != kTfLiteOk) return kTfLiteError;
    if (kernel == kKernelAuto && (had == 0 || had != s->scatter_chunks)) time_batch1_paths(s, values, cols, rp);
  }
  return kTfLiteOk;
}

static TfLiteStatus k_prepare(TfLiteContext* ctx, TfLiteNode* node) {
  Partition* part = (Partition*)node->user_data;
  if (part == NULL) {
    ctx->ReportError(ctx, "PruneSparseFC: out of memory when the delegate kernel was created");
    return kTfLiteError;
  }
  const int threads = wanted_threads(ctx, &part->options);
  int pooled = 0; /* a step splits across threads */
  for (int i = 0; i < part->n; ++i) {
    if (prepare_step(ctx, part, &part->steps[i]) != kTfLiteOk) return kTfLiteError;
    if (prepare_paths(ctx, part, &part->steps[i], threads) != kTfLiteOk) return kTfLiteError;
    if (part->steps[i].chunks > 1) pooled = 1;
  }
  Shared* sh = part->shared;
  if (sh != NULL && threads > 1 && pooled) {
    pthread_mutex_lock(&sh->mu);
    if ((!pool_here(sh->pool) || sh->pool->n < threads - 1) &&
        atomic_exchange_explicit(&sh->busy, 1, memory_order_acq_rel) == 0) { /* else in use: keep it as it is */
      pool_destroy(sh->pool);
      sh->pool = pool_create(threads - 1); /* NULL (no thread started): the steps run on the caller alone */
      atomic_store_explicit(&sh->busy, 0, memory_order_release);
    }
    pthread_mutex_unlock(&sh->mu);
  }
  return kTfLiteOk;
}

static TfLiteStatus k_invoke(TfLiteContext* ctx, TfLiteNode* node) {
  Partition* part = (Partition*)node->user_data;
  for (int i = 0; i < part->n; ++i) { /* nodes_to_replace is in execution order */
    Step* s = &part->steps[i];
    const float* x = s->src >= 0 ? part->steps[s->src].buf : ctx->tensors[s->x].data.f;
    float* y = s->internal ? s->buf : ctx->tensors[s->out].data.f;
    if (s->rows * s->n_out == 0) continue;
    if ((x == NULL && s->rows * s->n_in > 0) || y == NULL) {
      ctx->ReportError(ctx, "PruneSparseFC node %d (output '%s'): a tensor has no data at invoke", s->node,
                       tensor_name(ctx, s->out));
      return kTfLiteError;
    }
    const int32_t* rp = ctx->tensors[s->row_ptr].data.i32;
    int mode = s->path;
    if (mode == kKernelScatter && part->options.kernel == kKernelAuto &&
        (double)scatter_work(s, x) * s->scatter_cost >= (double)rp[s->n_out])
      mode = s->fast; /* too few zero inputs for the scatter path to be faster */
    if (mode == kKernelScatter) {
      scatter_lists(s, x);
    } else if (mode == kKernelTile) {
      tile_prepare_input(s, x);
    }
    Shared* sh = part->shared;
    Pool* pool = NULL;
    int threads = 1;
    if (sh != NULL && s->chunks > 1 && atomic_exchange_explicit(&sh->busy, 1, memory_order_acq_rel) == 0) {
      pool = pool_here(sh->pool) ? sh->pool : NULL; /* NULL: no thread could be started, or a fork()ed child */
      if (pool == NULL) atomic_store_explicit(&sh->busy, 0, memory_order_release);
    }
    if (pool != NULL) threads = s->chunks < pool_threads(pool) ? s->chunks : pool_threads(pool);
    Job local;
    Job* j = pool != NULL ? &pool->job : &local; /* the pool's threads are idle between steps */
    j->s = s;
    j->x = x;
    j->values = ctx->tensors[s->values].data.f;
    j->cols = ctx->tensors[s->cols].data.i32;
    j->rp = rp;
    j->bias = s->bias == kTfLiteOptionalTensor ? NULL : ctx->tensors[s->bias].data.f;
    j->y = y;
    j->mode = mode;
    j->chunks = s->chunks;
    j->bounds = s->bounds;
    atomic_store_explicit(&g_last_threads, threads, memory_order_relaxed);
    atomic_store_explicit(&g_last_path, mode, memory_order_relaxed);
    if (threads > 1) {
      pool_run(pool);
      atomic_fetch_add_explicit(&g_parallel_runs, 1ull, memory_order_relaxed);
    } else {
      for (int c = 0; c < j->chunks; ++c) run_chunk(j, c);
    }
    if (pool != NULL) atomic_store_explicit(&sh->busy, 0, memory_order_release);
  }
  return kTfLiteOk;
}

static TfLiteStatus delegate_prepare(TfLiteContext* ctx, TfLiteDelegate* delegate) {
  TfLiteIntArray* plan;
  if (ctx->GetExecutionPlan(ctx, &plan) != kTfLiteOk) return kTfLiteError;
  TfLiteIntArray* claim = (TfLiteIntArray*)malloc(sizeof(int) * (size_t)(plan->size + 1));
  if (claim == NULL) return kTfLiteError;
  claim->size = 0;
  for (int i = 0; i < plan->size; ++i) {
    TfLiteNode* node;
    TfLiteRegistration* reg;
    if (ctx->GetNodeAndRegistration(ctx, plan->data[i], &node, &reg) != kTfLiteOk) continue;
    if (reg->builtin_code == kTfLiteBuiltinCustom && reg->custom_name != NULL && strcmp(reg->custom_name, kOpName) == 0)
      claim->data[claim->size++] = plan->data[i];
  }
  TfLiteStatus status = kTfLiteOk;
  if (claim->size > 0) {
    TfLiteRegistration r;
    memset(&r, 0, sizeof(r));
    r.init = k_init;
    r.free = k_free;
    r.prepare = k_prepare;
    r.invoke = k_invoke;
    r.builtin_code = kTfLiteBuiltinCustom;
    r.custom_name = "PruneSparseFCDelegate";
    r.version = 1;
    status = ctx->ReplaceNodeSubsetsWithDelegateKernels(ctx, r, claim, delegate);
  }
  free(claim);
  return status;
}

typedef struct {
  TfLiteDelegate delegate; /* first: the TfLiteDelegate* handed out is this struct's address */
  Shared shared;
} Plugin;

static Plugin* plugin_new(Options options) {
  Plugin* plugin = (Plugin*)calloc(1, sizeof(Plugin));
  if (plugin == NULL) return NULL;
  plugin->shared.options = options;
  pthread_mutex_init(&plugin->shared.mu, NULL);
  atomic_init(&plugin->shared.busy, 0);
  plugin->delegate.data_ = &plugin->shared;
  plugin->delegate.Prepare = delegate_prepare;
  /* Required: without it ModifyGraphWithDelegate prepares every node first, the still unresolved custom op
   * included, and fails before delegate_prepare runs. */
  plugin->delegate.flags = kTfLiteDelegateFlagsAllowDynamicTensors;
  return plugin;
}

static void plugin_free(Plugin* plugin) {
  if (plugin == NULL) return;
  pool_destroy(plugin->shared.pool); /* the interpreters that used the delegate are gone */
  pthread_mutex_destroy(&plugin->shared.mu);
  free(plugin);
}

/* A decimal integer in [lo, hi], else -1 (lo >= 0). */
static long long parse_int(const char* s, long long lo, long long hi) {
  if (s == NULL || *s == '\0') return -1;
  char* end;
  long long v = strtoll(s, &end, 10);
  if (*end != '\0' || v < lo || v > hi) return -1;
  return v;
}

/* The external-delegate plugin entry points that load_delegate(path, options) calls. Options (values are strings):
 *   num_threads        threads of a large step, 1..64; unset or 0: the interpreter's (Interpreter(num_threads=N))
 *   parallel_min_work  nnz x rows from which a step is split across threads (default 32768; 0: always)
 * The count arrives as a C int from Python's ctypes, so only its low 32 bits are read. */
PRUNE_EXPORT TfLiteDelegate* tflite_plugin_create_delegate(char** keys, char** values, size_t n,
                                                           void (*report_error)(const char*)) {
  Options opt = {0, 32768, kKernelAuto};
  const size_t count = (size_t)(unsigned)n;
  for (size_t i = 0; i < count; ++i) {
    const char* key = keys != NULL ? keys[i] : NULL;
    const char* value = values != NULL ? values[i] : NULL;
    char what[256];
    long long v = -2;
    if (key != NULL && strcmp(key, "num_threads") == 0) {
      v = parse_int(value, 0, PRUNE_MAX_THREADS);
      if (v >= 0) opt.num_threads = (int)v;
    } else if (key != NULL && strcmp(key, "parallel_min_work") == 0) {
      v = parse_int(value, 0, (long long)1 << 62);
      if (v >= 0) opt.parallel_min_work = v;
    } else if (key != NULL && strcmp(key, "kernel") == 0) {
      v = -3;
      for (int k = 0; k < (int)(sizeof(kKernelNames) / sizeof(kKernelNames[0])); ++k)
        if (value != NULL && strcmp(value, kKernelNames[k]) == 0) v = opt.kernel = k;
    }
    if (v == -2) {
      snprintf(what, sizeof(what),
               "prune LiteRT delegate: unknown option '%s' (known: num_threads, parallel_min_work, kernel)",
               key != NULL ? key : "(null)");
    } else if (v == -3) {
      snprintf(what, sizeof(what),
               "prune LiteRT delegate: option kernel must be one of auto, gather, dot, scatter, tile, got '%s'",
               value != NULL ? value : "(null)");
    } else if (v == -1) {
      snprintf(what, sizeof(what), "prune LiteRT delegate: option %s must be an integer in [0, %lld], got '%s'", key,
               strcmp(key, "num_threads") == 0 ? (long long)PRUNE_MAX_THREADS : (long long)1 << 62,
               value != NULL ? value : "(null)");
    } else {
      continue;
    }
    if (report_error != NULL) report_error(what);
    return NULL;
  }
  Plugin* plugin = plugin_new(opt);
  if (plugin == NULL) {
    if (report_error != NULL) report_error("prune LiteRT delegate: out of memory");
    return NULL;
  }
  return &plugin->delegate;
}

PRUNE_EXPORT void tflite_plugin_destroy_delegate(TfLiteDelegate* delegate) { plugin_free((Plugin*)delegate); }

/* For a quick check that the file loaded is this library. */
PRUNE_EXPORT const char* prune_litert_delegate_op(void) { return kOpName; }

/* The vector path compiled in: "avx512 (16 lanes)", "avx2 (8 lanes)" or "scalar (1 lane)". */
PRUNE_EXPORT const char* prune_litert_delegate_path(void) {
#if defined(__AVX512F__)
  return PRUNE_PATH " (16 lanes)";
#elif defined(__AVX2__) && defined(__FMA__)
  return PRUNE_PATH " (8 lanes)";
#else
  return PRUNE_PATH " (1 lane)";
#endif
}

/* Steps run on several threads so far in this process, and the threads of the last step run (for the tests). */
PRUNE_EXPORT unsigned long long prune_litert_delegate_parallel_runs(void) {
  return atomic_load_explicit(&g_parallel_runs, memory_order_relaxed);
}
PRUNE_EXPORT int prune_litert_delegate_last_threads(void) {
  return atomic_load_explicit(&g_last_threads, memory_order_relaxed);
}

/* The path the last step run took: "gather", "dot", "scatter" or "tile" (for the tests). */
PRUNE_EXPORT const char* prune_litert_delegate_last_path(void) {
  return kKernelNames[atomic_load_explicit(&g_last_path, memory_order_relaxed)];
}
