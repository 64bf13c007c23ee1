// Native sparse kernels for prune.SparseDense (float32, CPU).
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
//   PruneSpmm(x, values, structure; n_in, n_out, transpose)
//       transpose = false: y = x @ W    (x [batch, n_in],  y [batch, n_out])
//       transpose = true:  y = x @ W^T  (x [batch, n_out], y [batch, n_in]), the input gradient
//   PruneSddmm(x, dy, values, structure; n_in, n_out)
//       dv[k] = sum_b x[b, i_k] * dy[b, j_k] for the k-th stored entry (i_k, j_k):
//       the values gradient (a sampled dense-dense product), no [nnz, batch] temporary.
//
// Batches of at least one machine vector (8 rows on AVX2, 16 on AVX-512) go
// through tiles of up to 4 vectors of batch rows: the tile of x is
// transposed into a [n_features, tile] buffer that stays in cache and each
// output row accumulates value * buffer[col] with vector FMAs, two entries
// at a time. The forward tile pass walks W^T and first gathers the values
// into W^T order (one pass over nnz, in parallel); the input gradient walks W
// as stored. Smaller batches walk W's rows directly: the forward pass
// scatters into per-unit partial outputs that are summed at the end, the
// input gradient gathers. Work runs on the op's intra-op thread pool. Every
// column and permutation entry is range-checked as it is read, so a corrupt
// structure gives InvalidArgument, never a wild read.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

using namespace tensorflow;  // NOLINT
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

namespace {

// One machine vector of floats. GCC lowers a 64-byte vector type through
// memory without AVX-512 (measured 15x slower on AVX2), so the width follows
// the instruction set the library is compiled for (-march=native).
#ifdef __AVX512F__
constexpr int kLanes = 16;
typedef float vec __attribute__((vector_size(64)));
#else
constexpr int kLanes = 8;
typedef float vec __attribute__((vector_size(32)));
#endif

// Per-thread scratch, grown on demand and reused across calls.
float* Scratch(int which, size_t n) {
  thread_local float* bufs[2] = {nullptr, nullptr};
  thread_local size_t caps[2] = {0, 0};
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

// Tile of NV vectors of batch rows [b0, b0 + tb), output rows [r0, r1):
// y[b, r] = sum_k vals[k] * x[b, cols[k]] over row r of the matrix.
template <int NV>
void Tile(const float* x, int64_t b0, int64_t tb, const Csr& m, const float* vals, int64_t r0, int64_t r1, float* y,
          Error* err) {
  constexpr int64_t W = NV * kLanes;
  constexpr int64_t kRowBlock = 64;
  const int64_t n_cols = m.n_cols, n_rows = m.n_rows;
  float* buf = Scratch(0, n_cols * W);
  float* obuf = Scratch(1, kRowBlock * W);
  for (int64_t c0 = 0; c0 < n_cols; c0 += 16) {  // transpose x[b0:b0+tb, :] into buf[c * W + q]
    const int64_t cn = std::min<int64_t>(16, n_cols - c0);
    for (int64_t q = 0; q < W; ++q) {
      if (q < tb) {
        const float* src = x + (b0 + q) * n_cols + c0;
        for (int64_t cc = 0; cc < cn; ++cc) buf[(c0 + cc) * W + q] = src[cc];
      } else {
        for (int64_t cc = 0; cc < cn; ++cc) buf[(c0 + cc) * W + q] = 0.0f;
      }
    }
  }
  for (int64_t rb = r0; rb < r1; rb += kRowBlock) {
    const int64_t re = std::min(r1, rb + kRowBlock);
    for (int64_t r = rb; r < re; ++r) {
      vec a[NV], b[NV];
      for (int q = 0; q < NV; ++q) a[q] = b[q] = vec{};
      int64_t k = m.rp[r];
      const int64_t e = m.rp[r + 1];
      for (; k + 1 < e; k += 2) {
        const uint32_t c0 = static_cast<uint32_t>(m.cols[k]), c1 = static_cast<uint32_t>(m.cols[k + 1]);
        if (c0 >= n_cols || c1 >= n_cols) { err->bad = true; return; }
        const vec* p0 = reinterpret_cast<const vec*>(buf + c0 * W);
        const vec* p1 = reinterpret_cast<const vec*>(buf + c1 * W);
        const float v0 = vals[k], v1 = vals[k + 1];
        for (int q = 0; q < NV; ++q) { a[q] += v0 * p0[q]; b[q] += v1 * p1[q]; }
      }
      if (k < e) {
        const uint32_t c0 = static_cast<uint32_t>(m.cols[k]);
        if (c0 >= n_cols) { err->bad = true; return; }
        const vec* p0 = reinterpret_cast<const vec*>(buf + c0 * W);
        for (int q = 0; q < NV; ++q) a[q] += vals[k] * p0[q];
      }
      vec* o = reinterpret_cast<vec*>(obuf + (r - rb) * W);
      for (int q = 0; q < NV; ++q) o[q] = a[q] + b[q];
    }
    for (int64_t q = 0; q < tb; ++q) {
      float* dst = y + (b0 + q) * n_rows;
      for (int64_t r = rb; r < re; ++r) dst[r] = obuf[(r - rb) * W + q];
    }
  }
}

// y = x @ M^T for M given by CSR (rows = outputs): tiles over the batch.
void TiledGather(OpKernelContext* ctx, const float* x, int64_t batch, const Csr& m, const float* vals, float* y,
                 Error* err) {
  const int threads = NumThreads(ctx);
  // 4 vectors per tile (measured best of 1..8 at 1024x1024 and 4096x4096 on
  // AVX2) while the transposed tile fits in half of L2, and no wider than the batch.
  int nv = 4;
  while (nv > 1 && (m.n_cols * nv * kLanes * 4 > (256 << 10) || (nv / 2) * kLanes >= batch)) nv /= 2;
  const int64_t w = nv * kLanes, tiles = (batch + w - 1) / w;
  // Split output rows as well when there are fewer tiles than threads.
  const int64_t splits = std::max<int64_t>(1, std::min<int64_t>((2 * threads + tiles - 1) / tiles, (m.n_rows + 63) / 64));
  const std::vector<int64_t> bounds = SplitRows(m.rp, m.n_rows, splits);
  Parallel(ctx, tiles * splits, [&](int64_t u) {
    const int64_t t = u / splits, s = u % splits;
    const int64_t b0 = t * w, tb = std::min(w, batch - b0);
    if (bounds[s] >= bounds[s + 1]) return;
    switch (nv) {
      case 4: Tile<4>(x, b0, tb, m, vals, bounds[s], bounds[s + 1], y, err); break;
      case 2: Tile<2>(x, b0, tb, m, vals, bounds[s], bounds[s + 1], y, err); break;
      default: Tile<1>(x, b0, tb, m, vals, bounds[s], bounds[s + 1], y, err); break;
    }
  });
}

// Small batch, gather: y[b, r] = sum over row r of M of vals[k] * x[b, cols[k]].
void SmallGather(OpKernelContext* ctx, const float* x, int64_t batch, const Csr& m, const float* vals, float* y,
                 Error* err) {
  const int64_t units = std::min<int64_t>(2 * NumThreads(ctx), std::max<int64_t>(1, m.rp[m.n_rows] / 8192));
  const std::vector<int64_t> bounds = SplitRows(m.rp, m.n_rows, units);
  Parallel(ctx, units, [&](int64_t u) {
    for (int64_t r = bounds[u]; r < bounds[u + 1]; ++r) {
      float acc[kLanes] = {0};
      for (int64_t k = m.rp[r]; k < m.rp[r + 1]; ++k) {
        const uint32_t c = static_cast<uint32_t>(m.cols[k]);
        if (c >= m.n_cols) { err->bad = true; return; }
        const float v = vals[k];
        for (int64_t b = 0; b < batch; ++b) acc[b] += v * x[b * m.n_cols + c];
      }
      for (int64_t b = 0; b < batch; ++b) y[b * m.n_rows + r] = acc[b];
    }
  });
}

// Small batch, scatter: y[b, cols[k]] += vals[k] * x[b, r] over the rows r of M
// (here rows = inputs), each unit into its own partial output, summed at the end.
void SmallScatter(OpKernelContext* ctx, const float* x, int64_t batch, const Csr& m, const float* vals, float* y,
                  Error* err) {
  const int64_t n_out = m.n_cols, n_in = m.n_rows;
  const int64_t units = std::min<int64_t>(NumThreads(ctx), std::max<int64_t>(1, m.rp[n_in] / 16384));
  const std::vector<int64_t> bounds = SplitRows(m.rp, n_in, units);
  std::vector<float> partial((units - 1) * batch * n_out);
  Parallel(ctx, units, [&](int64_t u) {
    float* out = u == 0 ? y : partial.data() + (u - 1) * batch * n_out;
    std::memset(out, 0, sizeof(float) * batch * n_out);
    for (int64_t r = bounds[u]; r < bounds[u + 1]; ++r) {
      for (int64_t b = 0; b < batch; ++b) {
        const float xv = x[b * n_in + r];
        float* ob = out + b * n_out;
        for (int64_t k = m.rp[r]; k < m.rp[r + 1]; ++k) {
          const uint32_t c = static_cast<uint32_t>(m.cols[k]);
          if (c >= n_out) { err->bad = true; return; }
          ob[c] += vals[k] * xv;
        }
      }
    }
  });
  for (int64_t u = 1; u < units; ++u) {
    const float* p = partial.data() + (u - 1) * batch * n_out;
    for (int64_t i = 0; i < batch * n_out; ++i) y[i] += p[i];
  }
}

// Reads the structure vector; checks its length and row pointers.
Status Unpack(const Tensor& structure, int64_t nnz, int64_t n_in, int64_t n_out, Csr* w, Csr* wt) {
  if (structure.dims() != 1 || structure.dim_size(0) != 3 * nnz + n_in + n_out + 2) {
    return errors::InvalidArgument("structure must have 3 * nnz + n_in + n_out + 2 = ", 3 * nnz + n_in + n_out + 2,
                                   " entries for nnz ", nnz, ", got shape ", structure.shape().DebugString());
  }
  const int32_t* s = structure.flat<int32_t>().data();
  *w = Csr{s, s + n_in + 1, nullptr, n_in, n_out};
  const int32_t* t = s + n_in + 1 + nnz;
  *wt = Csr{t, t + n_out + 1, t + n_out + 1 + nnz, n_out, n_in};
  for (const Csr* m : {w, wt}) {
    if (m->rp[0] != 0 || m->rp[m->n_rows] != nnz) return errors::InvalidArgument("structure row pointers do not span nnz");
    for (int64_t r = 0; r < m->n_rows; ++r)
      if (m->rp[r + 1] < m->rp[r]) return errors::InvalidArgument("structure row pointers decrease at row ", r);
  }
  return OkStatus();
}

class PruneSpmmOp : public OpKernel {
 public:
  explicit PruneSpmmOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n_in", &n_in_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n_out", &n_out_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose", &transpose_));
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
    OP_REQUIRES_OK(ctx, Unpack(ctx->input(2), nnz, n_in_, n_out_, &w, &wt));
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
    Error err;
    if (transpose_) {  // dx = dy @ W^T: gather along W's rows, values as stored
      if (batch < kLanes) SmallGather(ctx, x, batch, w, values, y, &err);
      else TiledGather(ctx, x, batch, w, values, y, &err);
    } else if (batch < kLanes) {  // y = x @ W, small batch: scatter along W's rows
      SmallScatter(ctx, x, batch, w, values, y, &err);
    } else {  // y = x @ W: gather along W^T's rows, values first gathered into W^T order
      Tensor tv_t;
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_FLOAT, TensorShape({nnz}), &tv_t));
      float* tv = tv_t.flat<float>().data();
      const int64_t units = std::min<int64_t>(NumThreads(ctx), (nnz + 32767) / 32768);
      const int64_t per = (nnz + units - 1) / units;
      Parallel(ctx, units, [&](int64_t u) {
        for (int64_t k = u * per, e = std::min(nnz, (u + 1) * per); k < e; ++k) {
          const uint32_t p = static_cast<uint32_t>(wt.perm[k]);
          if (p >= nnz) { err.bad = true; return; }
          tv[k] = values[p];
        }
      });
      if (!err.bad) TiledGather(ctx, x, batch, wt, tv, y, &err);
    }
    OP_REQUIRES(ctx, !err.bad, errors::InvalidArgument("structure holds an out-of-range column or permutation entry"));
  }

 private:
  int64_t n_in_, n_out_;
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
    OP_REQUIRES_OK(ctx, Unpack(ctx->input(3), nnz, n_in, n_out, &w, &wt));
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
    Error err;
    const int64_t units = std::min<int64_t>(2 * threads, std::max<int64_t>(1, nnz / 4096));
    const std::vector<int64_t> bounds = SplitRows(w.rp, n_in, units);

    if (batch < kLanes) {
      Parallel(ctx, units, [&](int64_t u) {
        for (int64_t i = bounds[u]; i < bounds[u + 1]; ++i) {
          for (int64_t k = w.rp[i]; k < w.rp[i + 1]; ++k) {
            const uint32_t j = static_cast<uint32_t>(w.cols[k]);
            if (j >= n_out) { err.bad = true; return; }
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
            if (j >= n_out) { err.bad = true; return; }
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
    OP_REQUIRES(ctx, !err.bad, errors::InvalidArgument("structure holds an out-of-range column entry"));
  }

 private:
  int64_t n_in_, n_out_;
};

}  // namespace

REGISTER_OP("PruneSpmm")
    .Input("x: float")
    .Input("values: float")
    .Input("structure: int32")
    .Attr("n_in: int >= 0")
    .Attr("n_out: int >= 0")
    .Attr("transpose: bool = false")
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
    .Doc("y = x @ W (transpose=false) or x @ W^T (transpose=true) for W [n_in, n_out] given by values and structure.");

REGISTER_OP("PruneSddmm")
    .Input("x: float")
    .Input("dy: float")
    .Input("values: float")
    .Input("structure: int32")
    .Attr("n_in: int >= 0")
    .Attr("n_out: int >= 0")
    .Output("dv: float")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(2));
      return OkStatus();
    })
    .Doc("dv[k] = sum_b x[b, i_k] * dy[b, j_k] over W's stored entries k = (i_k, j_k); values gives only nnz.");

REGISTER_KERNEL_BUILDER(Name("PruneSpmm").Device(DEVICE_CPU), PruneSpmmOp);
REGISTER_KERNEL_BUILDER(Name("PruneSddmm").Device(DEVICE_CPU), PruneSddmmOp);
