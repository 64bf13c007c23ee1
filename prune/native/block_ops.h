// Block-sparse kernels of prune.SparseDense, included by sparse_ops.cc inside its
// anonymous namespace (it provides vec, kLanes, Scratch, Parallel, SplitRows, Error).
//
// A structure is *blocked* with width C (4, 8, 16 or 32) when W's stored entries form
// whole 1 x C tiles along the output axis: row i holds columns [jb*C, jb*C + C) of
// every tile (i, jb) it stores, and nothing else (the tile of the last column block is
// narrower when C does not divide n_out). A Block((r, C)) pattern leaves such a
// structure for any r. Then W's row-major `values` already are the tiles, tile by
// tile in block-CSR order, so the layer's variables and saved format stay as they
// are; prune.native.structure appends a block section to the structure vector:
//
//   [ MAGIC | C | nb | brp (n_in + 1) | bcols (nb) | boff (nb) | tcp (n_cb + 1) | trows (nb) | toff (nb) ]
//
// brp/bcols/boff: block-CSR (tiles of input row i, their column block, the position
// in `values` of their first entry); tcp/trows/toff: the same tiles by column block
// (block-CSC), n_cb = ceil(n_out / C).
//
// Every product is a dense micro-kernel over the tiles: the C outputs of a tile are
// one to four machine vectors (TileVec), and NB batch rows are accumulated at once
// in NB x (C / lanes) vector registers, so each tile's values are loaded once per NB
// batch rows and every load of x or dy feeds a whole vector of multiply-adds:
//   forward  y[b, tile] += x[b, i] * w        (by column block; x tile transposed so
//                                             that its NB rows of input i share a line)
//   dx       dx[b, i] += <dy[b, tile], w>     (by input row; one horizontal sum per
//                                             (b, i) at the end)
//   dvalues  dv[tile] = sum_b x[b, i] dy[b, tile]   (by input row, 4 tiles at a time)
// Each tile's column block and position are range-checked where it is read (one
// compare per C entries), so a corrupt block section gives InvalidArgument.

constexpr int32_t kBlockMagic = 0x6b6c4231;  // "1Blk"

#if defined(__AVX512F__)
constexpr int kVecRegs = 32;
#else
constexpr int kVecRegs = 16;
#endif

struct BlockCsr {
  int64_t c = 0, nb = 0, n_in = 0, n_out = 0, n_cb = 0;
  const int32_t* brp = nullptr;
  const int32_t* bcols = nullptr;
  const int32_t* boff = nullptr;
  const int32_t* tcp = nullptr;
  const int32_t* trows = nullptr;
  const int32_t* toff = nullptr;
  int64_t Width(int64_t jb) const { return std::min<int64_t>(c, n_out - jb * c); }
};

// Number of int32 entries of the block section for these sizes.
inline int64_t BlockSectionSize(int64_t c, int64_t nb, int64_t n_in, int64_t n_out) {
  const int64_t n_cb = (n_out + c - 1) / c;
  return 3 + (n_in + 1) + (n_cb + 1) + 4 * nb;
}

// Reads a block section at s, within the `len` entries left in the structure, into *b and its length into
// *used; checks its header and pointers.
Status UnpackBlocks(const int32_t* s, int64_t len, int64_t nnz, int64_t n_in, int64_t n_out, BlockCsr* b,
                    int64_t* used) {
  if (len < 3 || s[0] != kBlockMagic) return errors::InvalidArgument("structure has a malformed block section");
  const int64_t c = s[1], nb = s[2];
  if ((c != 4 && c != 8 && c != 16 && c != 32) || nb < 0 || nb * c < nnz || nb > nnz ||
      BlockSectionSize(c, nb, n_in, n_out) > len)
    return errors::InvalidArgument("structure has a malformed block section (width ", c, ", ", nb, " tiles)");
  b->c = c;
  b->nb = nb;
  b->n_in = n_in;
  b->n_out = n_out;
  b->n_cb = (n_out + c - 1) / c;
  const int32_t* p = s + 3;
  b->brp = p;
  b->bcols = p + n_in + 1;
  b->boff = b->bcols + nb;
  b->tcp = b->boff + nb;
  b->trows = b->tcp + b->n_cb + 1;
  b->toff = b->trows + nb;
  for (auto [rp, n] : {std::pair<const int32_t*, int64_t>{b->brp, n_in}, {b->tcp, b->n_cb}}) {
    if (rp[0] != 0 || rp[n] != nb) return errors::InvalidArgument("structure block pointers do not span the tiles");
    if (!NonDecreasing(rp, n)) return errors::InvalidArgument("structure block pointers decrease");
  }
  *used = BlockSectionSize(c, nb, n_in, n_out);
  return OkStatus();
}

// The vectors of one tile of C floats: L lanes each, N of them.
template <int C>
struct TileVec {
  static constexpr int L = C < kLanes ? C : kLanes;
  static constexpr int N = C / L;
  // Batch rows per micro-kernel: N * NB accumulators plus a few registers for the tile.
  static constexpr int NB = std::min(16, (kVecRegs - 4) / N);
  typedef float V __attribute__((vector_size(L * 4)));
  typedef float U __attribute__((vector_size(L * 4), aligned(4), may_alias));  // unaligned loads and stores
};

// Loads the tile's `width` values at p into w, zero-padded to C. Loads and stores go
// through the unaligned vector type, never through the accumulators' addresses (a
// memcpy into or out of them kept GCC from holding them in registers: 3x slower).
template <int C>
inline void LoadTile(const float* p, int64_t width, typename TileVec<C>::V* w) {
  using T = TileVec<C>;
  if (width == C) {
#pragma GCC unroll 16
    for (int q = 0; q < T::N; ++q) w[q] = *reinterpret_cast<const typename T::U*>(p + q * T::L);
  } else {
    float tmp[C] = {};
    std::memcpy(tmp, p, sizeof(float) * width);
#pragma GCC unroll 16
    for (int q = 0; q < T::N; ++q) w[q] = *reinterpret_cast<const typename T::U*>(tmp + q * T::L);
  }
}

template <int C>
inline void StoreTile(const typename TileVec<C>::V* a, int64_t width, float* p) {
  using T = TileVec<C>;
  if (width == C) {
#pragma GCC unroll 16
    for (int q = 0; q < T::N; ++q) *reinterpret_cast<typename T::U*>(p + q * T::L) = a[q];
  } else {
    float tmp[C];
#pragma GCC unroll 16
    for (int q = 0; q < T::N; ++q) *reinterpret_cast<typename T::U*>(tmp + q * T::L) = a[q];
    std::memcpy(p, tmp, sizeof(float) * width);
  }
}

// y[b0 + b, jb-tile] for b < nbr and column blocks [j0, j1); xt: the batch rows'
// inputs as [n_in][NB] (row b of input i at xt[i * NB + b]; rows >= nbr are zeros).
template <int C>
void BlockForwardTile(const float* xt, const BlockCsr& m, const float* vals, int64_t nnz, int64_t j0, int64_t j1,
                      int64_t b0, int64_t nbr, float* y, Error* err) {
  using T = TileVec<C>;
  using V = typename T::V;
  constexpr int N = T::N, NB = T::NB;
  for (int64_t jb = j0; jb < j1; ++jb) {
    const int64_t width = m.Width(jb);
    V acc[NB][N];
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b)
#pragma GCC unroll 16
      for (int q = 0; q < N; ++q) acc[b][q] = V{};
    for (int64_t t = m.tcp[jb], e = m.tcp[jb + 1]; t < e; ++t) {
      const uint32_t i = static_cast<uint32_t>(m.trows[t]);
      const uint32_t off = static_cast<uint32_t>(m.toff[t]);
      if (i >= m.n_in || off + width > nnz) { err->bad = true; return; }
      V w[N];
      LoadTile<C>(vals + off, width, w);
      const float* xi = xt + i * NB;
#pragma GCC unroll 16
      for (int b = 0; b < NB; ++b)
#pragma GCC unroll 16
        for (int q = 0; q < N; ++q) acc[b][q] += xi[b] * w[q];
    }
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b)  // constant indices, so that acc stays in registers
      if (b < nbr) StoreTile<C>(acc[b], width, y + (b0 + b) * m.n_out + jb * C);
  }
}

// Batch 1 (and rows one at a time): no transposes, x's row is the [n_in][1] tile.
template <int C>
void BlockForwardRow(const float* x, const BlockCsr& m, const float* vals, int64_t nnz, int64_t j0, int64_t j1,
                     float* y, Error* err) {
  using T = TileVec<C>;
  using V = typename T::V;
  constexpr int N = T::N;
  for (int64_t jb = j0; jb < j1; ++jb) {
    const int64_t width = m.Width(jb);
    V a[N], b[N];
#pragma GCC unroll 16
    for (int q = 0; q < N; ++q) a[q] = b[q] = V{};
    int64_t t = m.tcp[jb];
    const int64_t e = m.tcp[jb + 1];
    for (; t + 1 < e; t += 2) {  // two independent chains
      const uint32_t i0 = static_cast<uint32_t>(m.trows[t]), i1 = static_cast<uint32_t>(m.trows[t + 1]);
      const uint32_t o0 = static_cast<uint32_t>(m.toff[t]), o1 = static_cast<uint32_t>(m.toff[t + 1]);
      if (i0 >= m.n_in || i1 >= m.n_in || o0 + width > nnz || o1 + width > nnz) { err->bad = true; return; }
      V w0[N], w1[N];
      LoadTile<C>(vals + o0, width, w0);
      LoadTile<C>(vals + o1, width, w1);
      const float x0 = x[i0], x1 = x[i1];
#pragma GCC unroll 16
      for (int q = 0; q < N; ++q) { a[q] += x0 * w0[q]; b[q] += x1 * w1[q]; }
    }
    if (t < e) {
      const uint32_t i0 = static_cast<uint32_t>(m.trows[t]), o0 = static_cast<uint32_t>(m.toff[t]);
      if (i0 >= m.n_in || o0 + width > nnz) { err->bad = true; return; }
      V w0[N];
      LoadTile<C>(vals + o0, width, w0);
#pragma GCC unroll 16
      for (int q = 0; q < N; ++q) a[q] += x[i0] * w0[q];
    }
#pragma GCC unroll 16
    for (int q = 0; q < N; ++q) a[q] += b[q];
    StoreTile<C>(a, width, y + jb * C);
  }
}

// Multiply-adds below which a block op runs on the calling thread: waking the pool
// costs about as much as 1-2M multiply-adds of these kernels on one thread.
constexpr int64_t kBlockSerial = 1 << 20;

int64_t BlockUnits(OpKernelContext* ctx, int64_t macs, int64_t max_units) {
  if (macs < kBlockSerial) return 1;
  return std::max<int64_t>(1, std::min<int64_t>(max_units, 2 * NumThreads(ctx)));
}

template <int C>
void BlockForward(OpKernelContext* ctx, const float* x, int64_t batch, const BlockCsr& m, const float* vals,
                  int64_t nnz, float* y, Error* err) {
  constexpr int NB = TileVec<C>::NB;
  const int64_t macs = m.nb * C * batch;
  if (batch < 4) {  // row by row: no transposes
    const int64_t units = BlockUnits(ctx, macs, m.n_cb);
    const std::vector<int64_t> bounds = SplitRows(m.tcp, m.n_cb, units);
    Parallel(ctx, units, [&](int64_t u) {
      for (int64_t b = 0; b < batch; ++b)
        BlockForwardRow<C>(x + b * m.n_in, m, vals, nnz, bounds[u], bounds[u + 1], y + b * m.n_out, err);
    });
    return;
  }
  const int64_t tiles = (batch + NB - 1) / NB;
  const int64_t units = BlockUnits(ctx, macs, tiles * m.n_cb);
  const int64_t splits = std::max<int64_t>(1, std::min<int64_t>(m.n_cb, (units + tiles - 1) / tiles));
  const std::vector<int64_t> bounds = SplitRows(m.tcp, m.n_cb, splits);
  Parallel(ctx, units == 1 ? 1 : tiles * splits, [&](int64_t u) {
    const int64_t t0 = units == 1 ? 0 : u / splits, t1 = units == 1 ? tiles : t0 + 1;
    const int64_t s = units == 1 ? 0 : u % splits;
    const int64_t j0 = units == 1 ? 0 : bounds[s], j1 = units == 1 ? m.n_cb : bounds[s + 1];
    if (j0 >= j1) return;
    float* xt = Scratch(0, m.n_in * NB);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b0 = t * NB, nbr = std::min<int64_t>(NB, batch - b0);
      for (int64_t i0 = 0; i0 < m.n_in; i0 += 64) {  // transpose x[b0:b0+nbr, :] into xt[i][b], zero-padded
        const int64_t i1 = std::min<int64_t>(m.n_in, i0 + 64);
        for (int64_t b = 0; b < NB; ++b) {
          if (b < nbr) {
            const float* src = x + (b0 + b) * m.n_in;
            for (int64_t i = i0; i < i1; ++i) xt[i * NB + b] = src[i];
          } else {
            for (int64_t i = i0; i < i1; ++i) xt[i * NB + b] = 0.0f;
          }
        }
      }
      BlockForwardTile<C>(xt, m, vals, nnz, j0, j1, b0, nbr, y, err);
    }
  });
}

template <int C>
inline float HSum(const typename TileVec<C>::V* a) {
  using T = TileVec<C>;
  typename T::V s = a[0];
#pragma GCC unroll 16
  for (int q = 1; q < T::N; ++q) s += a[q];
  float total = 0.0f;
  for (int l = 0; l < T::L; ++l) total += s[l];
  return total;
}

// dx[b0 + b, i] for b < nbr (rows past nbr repeat row nbr - 1, not stored), input rows [i0, i1).
template <int C, int NB>
void BlockInputGradTile(const float* dy, const BlockCsr& m, const float* vals, int64_t nnz, int64_t i0, int64_t i1,
                        int64_t b0, int64_t nbr, float* dx, Error* err) {
  using T = TileVec<C>;
  using V = typename T::V;
  constexpr int N = T::N;
  const float* rows[NB];
#pragma GCC unroll 16
  for (int b = 0; b < NB; ++b) rows[b] = dy + (b0 + std::min<int64_t>(b, nbr - 1)) * m.n_out;
  for (int64_t i = i0; i < i1; ++i) {
    float edge[NB] = {};
    V acc[NB][N];
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b)
#pragma GCC unroll 16
      for (int q = 0; q < N; ++q) acc[b][q] = V{};
    for (int64_t t = m.brp[i], e = m.brp[i + 1]; t < e; ++t) {
      const uint32_t jb = static_cast<uint32_t>(m.bcols[t]), off = static_cast<uint32_t>(m.boff[t]);
      if (jb >= m.n_cb) { err->bad = true; return; }
      const int64_t width = m.Width(jb);
      if (off + width > nnz) { err->bad = true; return; }
      if (width == C) {
        V w[N];
        LoadTile<C>(vals + off, C, w);
#pragma GCC unroll 16
        for (int b = 0; b < NB; ++b)
#pragma GCC unroll 16
          for (int q = 0; q < N; ++q)
            acc[b][q] += *reinterpret_cast<const typename T::U*>(rows[b] + jb * C + q * T::L) * w[q];
      } else {  // the edge tile (dy's row ends inside it): scalar, kept out of the vector accumulators
        for (int b = 0; b < NB; ++b)
          for (int64_t l = 0; l < width; ++l) edge[b] += rows[b][jb * C + l] * vals[off + l];
      }
    }
#pragma GCC unroll 16
    for (int b = 0; b < NB; ++b)  // constant indices, so that acc stays in registers
      if (b < nbr) dx[(b0 + b) * m.n_in + i] = HSum<C>(acc[b]) + edge[b];
  }
}

// dx for batch rows [b0, b0 + nbr), nbr <= kLanes, by column block: dyt holds dy's
// rows transposed ([n_out][kLanes]), so the tile's C columns are C vectors over the
// batch rows, reused by every tile of the column block; each tile adds
// sum_l w[l] * dyt[col l] into dxt[i] (a vector over the batch rows).
template <int C>
void BlockInputGradChunk(const float* dy, int64_t b0, int64_t nbr, const BlockCsr& m, const float* vals, int64_t nnz,
                         float* dx, Error* err) {
  float* dyt = Scratch(0, m.n_out * kLanes);
  float* dxt = Scratch(1, m.n_in * kLanes);
  for (int64_t j = 0; j < m.n_out; ++j)
    for (int b = 0; b < kLanes; ++b) dyt[j * kLanes + b] = b < nbr ? dy[(b0 + b) * m.n_out + j] : 0.0f;
  std::memset(dxt, 0, sizeof(float) * m.n_in * kLanes);
  for (int64_t jb = 0; jb < m.n_cb; ++jb) {
    const int64_t width = m.Width(jb);
    vec d[C];  // the column block's C columns, in registers for all its tiles (a pointer into dyt was
               // reloaded per tile, as dxt's stores might alias it: two loads per FMA)
#pragma GCC unroll 32
    for (int l = 0; l < C; ++l) d[l] = reinterpret_cast<const vec*>(dyt + jb * C * kLanes)[l];
    for (int64_t t = m.tcp[jb], e = m.tcp[jb + 1]; t < e; ++t) {
      const uint32_t i = static_cast<uint32_t>(m.trows[t]), off = static_cast<uint32_t>(m.toff[t]);
      if (i >= m.n_in || off + width > nnz) { err->bad = true; return; }
      const float* w = vals + off;
      vec a0 = vec{}, a1 = vec{}, a2 = vec{}, a3 = vec{};
      if (width == C) {
#pragma GCC unroll 32
        for (int l = 0; l < C; l += 4) {
          a0 += w[l] * d[l];
          a1 += w[l + 1] * d[l + 1];
          a2 += w[l + 2] * d[l + 2];
          a3 += w[l + 3] * d[l + 3];
        }
      } else {
        for (int64_t l = 0; l < width; ++l) a0 += w[l] * d[l];
      }
      *reinterpret_cast<vec*>(dxt + i * kLanes) += (a0 + a1) + (a2 + a3);
    }
  }
  for (int64_t i = 0; i < m.n_in; ++i)  // dxt read in order, dx written along nbr rows
    for (int64_t b = 0; b < nbr; ++b) dx[(b0 + b) * m.n_in + i] = dxt[i * kLanes + b];
}

template <int C>
void BlockInputGrad(OpKernelContext* ctx, const float* dy, int64_t batch, const BlockCsr& m, const float* vals,
                    int64_t nnz, float* dx, Error* err) {
  if (batch >= kLanes) {  // chunks of one vector of batch rows, one per unit of work
    const int64_t chunks = (batch + kLanes - 1) / kLanes;
    Parallel(ctx, BlockUnits(ctx, m.nb * C * batch, chunks) == 1 ? 1 : chunks, [&](int64_t u) {
      const bool all = BlockUnits(ctx, m.nb * C * batch, chunks) == 1;
      for (int64_t c = all ? 0 : u, e = all ? chunks : u + 1; c < e; ++c)
        BlockInputGradChunk<C>(dy, c * kLanes, std::min<int64_t>(kLanes, batch - c * kLanes), m, vals, nnz, dx, err);
    });
    return;
  }
  constexpr int NB = TileVec<C>::NB;
  const int64_t nbt = batch < NB ? 1 : NB;  // batch rows per pass: NB, or one at a time below NB
  const int64_t tiles = (batch + nbt - 1) / nbt;
  const int64_t units = BlockUnits(ctx, m.nb * C * batch, tiles * m.n_in);
  const int64_t splits = std::max<int64_t>(1, std::min<int64_t>(m.n_in, (units + tiles - 1) / tiles));
  const std::vector<int64_t> bounds = SplitRows(m.brp, m.n_in, units == 1 ? 1 : splits);
  const int64_t work = units == 1 ? 1 : tiles * splits;
  Parallel(ctx, work, [&](int64_t u) {
    const int64_t t0 = work == 1 ? 0 : u / splits, t1 = work == 1 ? tiles : t0 + 1;
    const int64_t s = work == 1 ? 0 : u % splits;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b0 = t * nbt, nbr = std::min<int64_t>(nbt, batch - b0);
      if (nbt == 1) BlockInputGradTile<C, 1>(dy, m, vals, nnz, bounds[s], bounds[s + 1], b0, nbr, dx, err);
      else BlockInputGradTile<C, NB>(dy, m, vals, nnz, bounds[s], bounds[s + 1], b0, nbr, dx, err);
    }
  });
}

// dv for the tiles of input rows [i0, i1): four full tiles at a time over the whole batch.
template <int C>
void BlockValuesGradRows(const float* x, const float* dy, int64_t batch, const BlockCsr& m, int64_t nnz, int64_t i0,
                         int64_t i1, float* dv, Error* err) {
  using T = TileVec<C>;
  using V = typename T::V;
  constexpr int N = T::N, G = 4;
  for (int64_t i = i0; i < i1; ++i) {
    int64_t t = m.brp[i];
    const int64_t e = m.brp[i + 1];
    while (t < e) {
      int64_t jb[G], off[G];
      int g = 0;
      for (; g < G && t + g < e; ++g) {
        jb[g] = static_cast<uint32_t>(m.bcols[t + g]);
        off[g] = static_cast<uint32_t>(m.boff[t + g]);
        if (jb[g] >= m.n_cb || off[g] + m.Width(jb[g]) > nnz) { err->bad = true; return; }
        if (m.Width(jb[g]) != C) break;  // an edge tile ends the group; done alone below
      }
      if (g == 0) {  // the edge tile (narrower than C): scalar
        const int64_t width = m.Width(jb[0]);
        for (int64_t l = 0; l < width; ++l) {
          float s = 0.0f;
          for (int64_t b = 0; b < batch; ++b) s += x[b * m.n_in + i] * dy[b * m.n_out + jb[0] * C + l];
          dv[off[0] + l] = s;
        }
        t += 1;
        continue;
      }
      V acc[G][N];
#pragma GCC unroll 16
      for (int h = 0; h < G; ++h)
#pragma GCC unroll 16
        for (int q = 0; q < N; ++q) acc[h][q] = V{};
      for (int64_t b = 0; b < batch; ++b) {
        const float xb = x[b * m.n_in + i];
        const float* row = dy + b * m.n_out;
#pragma GCC unroll 16
        for (int h = 0; h < G; ++h) {
          if (h >= g) break;
#pragma GCC unroll 16
          for (int q = 0; q < N; ++q) acc[h][q] += xb * *reinterpret_cast<const typename T::U*>(row + jb[h] * C + q * T::L);
        }
      }
#pragma GCC unroll 16
      for (int h = 0; h < G; ++h)  // constant indices, so that acc stays in registers
        if (h < g) StoreTile<C>(acc[h], C, dv + off[h]);
      t += g;
    }
  }
}

// dv for the tiles of column blocks [j0, j1), batch >= NB: per column block and chunk of
// NB batch rows, dy's NB rows of the tile columns stay in registers and every tile of
// the column block adds sum_b xt[i][b] * dy[b, tile] (xt: x transposed, [n_in][bp]).
template <int C>
void BlockValuesGradCols(const float* xt, int64_t bp, const float* dy, int64_t batch, const BlockCsr& m, int64_t nnz,
                         int64_t j0, int64_t j1, float* dv, Error* err) {
  using T = TileVec<C>;
  using V = typename T::V;
  constexpr int N = T::N, NB = T::NB;
  for (int64_t jb = j0; jb < j1; ++jb) {
    const int64_t width = m.Width(jb);
    for (int64_t b0 = 0; b0 < batch; b0 += NB) {
      V d[NB][N];
#pragma GCC unroll 16
      for (int b = 0; b < NB; ++b) {
        if (b0 + b < batch) LoadTile<C>(dy + (b0 + b) * m.n_out + jb * C, width, d[b]);
        else
#pragma GCC unroll 16
          for (int q = 0; q < N; ++q) d[b][q] = V{};
      }
      for (int64_t t = m.tcp[jb], e = m.tcp[jb + 1]; t < e; ++t) {
        const uint32_t i = static_cast<uint32_t>(m.trows[t]), off = static_cast<uint32_t>(m.toff[t]);
        if (i >= m.n_in || off + width > nnz) { err->bad = true; return; }
        const float* xi = xt + i * bp + b0;  // zeros past the batch
        V a[N], c[N];
#pragma GCC unroll 16
        for (int q = 0; q < N; ++q) a[q] = c[q] = V{};
#pragma GCC unroll 16
        for (int b = 0; b < NB; b += 2)
#pragma GCC unroll 16
          for (int q = 0; q < N; ++q) {
            a[q] += xi[b] * d[b][q];
            if (b + 1 < NB) c[q] += xi[b + 1] * d[b + 1][q];
          }
#pragma GCC unroll 16
        for (int q = 0; q < N; ++q) a[q] += c[q];
        if (b0 > 0) {
          V old[N];
          LoadTile<C>(dv + off, width, old);
#pragma GCC unroll 16
          for (int q = 0; q < N; ++q) a[q] += old[q];
        }
        StoreTile<C>(a, width, dv + off);
      }
    }
  }
}

template <int C>
void BlockValuesGrad(OpKernelContext* ctx, const float* x, const float* dy, int64_t batch, const BlockCsr& m,
                     int64_t nnz, float* dv, Error* err) {
  constexpr int NB = TileVec<C>::NB;
  if (batch >= NB) {
    const int64_t bp = (batch + NB - 1) / NB * NB;
    float* xt = Scratch(2, m.n_in * bp);  // the calling thread's; read by the units below
    const int64_t units = BlockUnits(ctx, m.nb * C * batch, m.n_cb);
    const int64_t step = (m.n_in + units - 1) / units;
    Parallel(ctx, units, [&](int64_t u) {  // in blocks of 64 inputs: x's rows read in lines, few pages at once
      const int64_t i0 = std::min(m.n_in, u * step), i1 = std::min(m.n_in, i0 + step);
      for (int64_t ib = i0; ib < i1; ib += 64) {
        const int64_t ie = std::min(i1, ib + 64);
        for (int64_t b = 0; b < bp; ++b)
          for (int64_t i = ib; i < ie; ++i) xt[i * bp + b] = b < batch ? x[b * m.n_in + i] : 0.0f;
      }
    });
    const std::vector<int64_t> bounds = SplitRows(m.tcp, m.n_cb, units);
    Parallel(ctx, units, [&](int64_t u) {
      BlockValuesGradCols<C>(xt, bp, dy, batch, m, nnz, bounds[u], bounds[u + 1], dv, err);
    });
    return;
  }
  const int64_t units = BlockUnits(ctx, m.nb * C * batch, m.n_in);
  const std::vector<int64_t> bounds = SplitRows(m.brp, m.n_in, units);
  Parallel(ctx, units, [&](int64_t u) {
    BlockValuesGradRows<C>(x, dy, batch, m, nnz, bounds[u], bounds[u + 1], dv, err);
  });
}

// Whether the block kernels run: a block section, and tiles that fill at least half a
// machine vector, or a batch below one vector. With AVX-512, 4-wide tiles (a quarter of a
// vector) measured slower than the general kernels at batch 32 and 256 (1024^2, 4x4 blocks,
// 80%: forward 0.52 vs 0.48 ms and 3.74 vs 2.77 ms, training step 11.5 vs 7.8 ms at batch 256)
// and faster at batch 1 (0.057 vs 0.175 ms).
inline bool UseBlocks(const BlockCsr& b, int64_t batch) {
  return b.c != 0 && (2 * b.c >= kLanes || batch < kLanes);
}

// Dispatch on the tile width (checked by UnpackBlocks).
#define PRUNE_BLOCK_DISPATCH(c, fn, ...)          \
  switch (c) {                                     \
    case 4: fn<4>(__VA_ARGS__); break;             \
    case 8: fn<8>(__VA_ARGS__); break;             \
    case 16: fn<16>(__VA_ARGS__); break;           \
    default: fn<32>(__VA_ARGS__); break;           \
  }
