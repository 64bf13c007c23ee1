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
 * The kernel (sparse_fc): for each output o, the dot product over its CSR entries is vectorised by the
 * instruction set the library is compiled for (litert.py builds with -march=native when the compiler takes it):
 * AVX-512F, 16 entries at a time (values and cols loaded, x gathered, fused multiply-add, a masked tail, one
 * horizontal sum per output); AVX2 + FMA, 8 at a time (masked tail likewise); else scalar C. Up to 4 rows of x
 * (the batch) go through one pass over an output's entries, so the index and value loads are shared. The sum
 * order differs from a sequential one (results agree to float rounding). prune_litert_delegate_path() names
 * the path compiled in.
 *
 * Threads: a step whose work (nnz x rows) reaches parallel_min_work (default 32768) is split across threads by
 * output ranges of equal cost (nnz + a per-output constant), each thread writing its own outputs; the steps run
 * one after another (each waits for all its threads). The thread count is the delegate option num_threads
 * when given (load_delegate(path, {"num_threads": "2"})), else the interpreter's (Interpreter(num_threads=N),
 * TfLiteContext.recommended_num_threads), else 1. The threads are a small pool shared by the delegate's partitions
 * (created at prepare, joined when the delegate is destroyed); between jobs they poll for 0.1 ms, then sleep on a
 * condition variable. An interpreter on another thread that shares the delegate runs on its caller alone while
 * the pool is busy.
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
} Options;

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
  size_t bounds[PRUNE_MAX_THREADS + 1]; /* thread t computes outputs [bounds[t], bounds[t + 1]) */
} Job;

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

static inline float activate(int activation, float a) {
  if (activation == kActRelu) return a > 0.0f ? a : 0.0f;
  if (activation == kActRelu6) {
    a = a > 0.0f ? a : 0.0f;
    return a < 6.0f ? a : 6.0f;
  }
  return a;
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

/* Outputs [o0, o1) of every row. */
static void sparse_fc(const Job* j, size_t o0, size_t o1) {
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

/* Splits the outputs into `threads` ranges of about equal cost rp[o] + PRUNE_ROW_COST * o. */
static void chunk(Job* j, int threads) {
  const size_t n_out = j->s->n_out;
  const double total = (double)j->rp[n_out] + (double)PRUNE_ROW_COST * (double)n_out;
  j->bounds[0] = 0;
  for (int t = 1; t < threads; ++t) {
    const double want = total * t / threads;
    size_t lo = j->bounds[t - 1], hi = n_out; /* the first o in [lo, hi] whose cost reaches want */
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if ((double)j->rp[mid] + (double)PRUNE_ROW_COST * (double)mid < want) lo = mid + 1;
      else hi = mid;
    }
    j->bounds[t] = lo;
  }
  j->bounds[threads] = n_out;
}

/* ---- the thread pool ------------------------------------------------------------------------------------- */

typedef struct Pool {
  int n;                     /* threads besides the caller */
  pthread_t tids[PRUNE_MAX_THREADS];
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  atomic_uint gen;           /* bumped (under mu) for each job and to stop */
  atomic_int pending;        /* threads still running the current job */
  atomic_int stop;
  int threads;               /* of the current job, the caller included */
  pid_t pid;                 /* the process whose threads these are: a fork()ed child has none of them */
  Job job;
} Pool;

typedef struct {
  Pool* pool;
  int id;                    /* 1..n; the caller is 0 */
} WorkerArg;

static atomic_ullong g_parallel_runs;  /* steps run on several threads (for the tests) */
static atomic_int g_last_threads;      /* threads of the last step run */

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

static void* worker(void* arg) {
  WorkerArg* a = (WorkerArg*)arg;
  Pool* p = a->pool;
  const int id = a->id;
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
    if (id < p->threads) sparse_fc(&p->job, p->job.bounds[id], p->job.bounds[id + 1]);
    if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->done);
      pthread_mutex_unlock(&p->mu);
    }
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
  atomic_init(&p->pending, 0);
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

/* Runs p->job (its bounds set for `threads` <= p->n + 1 threads) on the pool and the caller; returns when done. */
static void pool_run(Pool* p, int threads) {
  p->threads = threads;
  atomic_store_explicit(&p->pending, p->n, memory_order_relaxed);
  pthread_mutex_lock(&p->mu);
  atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  sparse_fc(&p->job, p->job.bounds[0], p->job.bounds[1]);
  int polls = 0;
  long long since = 0;
  while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
    if (keep_spinning(&polls, &since)) continue;
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) pthread_cond_wait(&p->done, &p->mu);
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
  for (int i = 0; i < part->n; ++i) free(part->steps[i].buf);
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

static TfLiteStatus k_prepare(TfLiteContext* ctx, TfLiteNode* node) {
  Partition* part = (Partition*)node->user_data;
  if (part == NULL) {
    ctx->ReportError(ctx, "PruneSparseFC: out of memory when the delegate kernel was created");
    return kTfLiteError;
  }
  long long most = 0; /* the largest step's work */
  for (int i = 0; i < part->n; ++i) {
    if (prepare_step(ctx, part, &part->steps[i]) != kTfLiteOk) return kTfLiteError;
    const Step* s = &part->steps[i];
    long long work = (long long)ctx->tensors[s->values].dims->data[0] * (long long)s->rows;
    if (work > most) most = work;
  }
  const int threads = wanted_threads(ctx, &part->options);
  Shared* sh = part->shared;
  if (sh != NULL && threads > 1 && most >= part->options.parallel_min_work) {
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
    const long long work = (long long)ctx->tensors[s->row_ptr].data.i32[s->n_out] * (long long)s->rows;
    Shared* sh = part->shared;
    Pool* pool = NULL;
    int threads = 1;
    if (sh != NULL && work >= part->options.parallel_min_work && (threads = wanted_threads(ctx, &part->options)) > 1 &&
        atomic_exchange_explicit(&sh->busy, 1, memory_order_acq_rel) == 0) {
      pool = pool_here(sh->pool) ? sh->pool : NULL; /* NULL: no thread could be started, or a fork()ed child */
      if (pool == NULL) atomic_store_explicit(&sh->busy, 0, memory_order_release);
    }
    if (pool == NULL) threads = 1;
    if (threads > pool_threads(pool)) threads = pool_threads(pool);
    if ((size_t)threads > s->n_out) threads = (int)s->n_out;
    Job local;
    Job* j = pool != NULL ? &pool->job : &local; /* the pool's threads are idle between steps */
    j->s = s;
    j->x = x;
    j->values = ctx->tensors[s->values].data.f;
    j->cols = ctx->tensors[s->cols].data.i32;
    j->rp = ctx->tensors[s->row_ptr].data.i32;
    j->bias = s->bias == kTfLiteOptionalTensor ? NULL : ctx->tensors[s->bias].data.f;
    j->y = y;
    atomic_store_explicit(&g_last_threads, threads, memory_order_relaxed);
    if (threads > 1) {
      chunk(j, threads);
      pool_run(pool, threads);
      atomic_fetch_add_explicit(&g_parallel_runs, 1ull, memory_order_relaxed);
    } else {
      sparse_fc(j, 0, s->n_out);
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
  Options opt = {0, 32768};
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
    }
    if (v == -2) {
      snprintf(what, sizeof(what), "prune LiteRT delegate: unknown option '%s' (known: num_threads, parallel_min_work)",
               key != NULL ? key : "(null)");
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
