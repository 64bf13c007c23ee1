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
 * Single-threaded, scalar C (the compiler may vectorise the bias copy; the gather loop is not vectorised).
 *
 * Adjacent claimed nodes form one delegate partition; tensors produced and consumed inside it are not
 * allocated by the interpreter, so the partition kernel owns buffers for them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "litert_abi.h"

#define PRUNE_EXPORT __attribute__((visibility("default")))
#define PRUNE_MAX_RANK 8

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

typedef struct {
  int n;
  Step* steps;
} Partition;

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
  for (int i = 0; i < part->n; ++i)
    if (prepare_step(ctx, part, &part->steps[i]) != kTfLiteOk) return kTfLiteError;
  return kTfLiteOk;
}

static void sparse_fc(const Step* s, const float* x, const float* values, const int32_t* cols, const int32_t* rp,
                      const float* bias, float* y) {
  const size_t n_in = s->n_in, n_out = s->n_out;
  for (size_t b = 0; b < s->rows; ++b) {
    const float* xr = x + b * n_in;
    float* yr = y + b * n_out;
    for (size_t o = 0; o < n_out; ++o) {
      float acc = bias != NULL ? bias[o] : 0.0f;
      for (int32_t k = rp[o]; k < rp[o + 1]; ++k) acc += values[k] * xr[cols[k]];
      if (s->activation == kActRelu) {
        acc = acc > 0.0f ? acc : 0.0f;
      } else if (s->activation == kActRelu6) {
        acc = acc > 0.0f ? acc : 0.0f;
        acc = acc < 6.0f ? acc : 6.0f;
      }
      yr[o] = acc;
    }
  }
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
    const float* bias = s->bias == kTfLiteOptionalTensor ? NULL : ctx->tensors[s->bias].data.f;
    sparse_fc(s, x, ctx->tensors[s->values].data.f, ctx->tensors[s->cols].data.i32, ctx->tensors[s->row_ptr].data.i32,
              bias, y);
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

/* The external-delegate plugin entry points that load_delegate() calls (options are ignored). */
PRUNE_EXPORT TfLiteDelegate* tflite_plugin_create_delegate(char** keys, char** values, size_t n,
                                                           void (*report_error)(const char*)) {
  (void)keys;
  (void)values;
  (void)n;
  TfLiteDelegate* d = (TfLiteDelegate*)calloc(1, sizeof(TfLiteDelegate));
  if (d == NULL) {
    if (report_error != NULL) report_error("prune LiteRT delegate: out of memory");
    return NULL;
  }
  d->Prepare = delegate_prepare;
  /* Required: without it ModifyGraphWithDelegate prepares every node first, the still unresolved custom op
   * included, and fails before delegate_prepare runs. */
  d->flags = kTfLiteDelegateFlagsAllowDynamicTensors;
  return d;
}

PRUNE_EXPORT void tflite_plugin_destroy_delegate(TfLiteDelegate* delegate) { free(delegate); }

/* For a quick check that the file loaded is this library. */
PRUNE_EXPORT const char* prune_litert_delegate_op(void) { return kOpName; }
