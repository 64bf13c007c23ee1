// The inner loop of prune's general kernels alone, on synthetic data in cache: how many multiply-adds per ns it
// reaches on this CPU when nothing else costs (no TensorFlow, no transposes, no value gather, no dispatch), and
// the CPU's own FMA peak beside it. benchmarks/loop_limit.py builds it with the native library's flags and
// includes the loop from prune/native/sparse_ops.cc itself (kernel.inc, written from the source at each run), so
// the loop timed here is the one the op runs.
//
//   loop_limit peak  THREADS REPS                       register-only FMAs: the FMA peak
//   loop_limit entries THREADS REPS N_COLS SEG ROWS     AddEntries<4, false> over ROWS rows of SEG entries each,
//                                                       at random sorted columns of an N_COLS x W tile
//
// Prints one line per round: "<seconds> <multiply-adds>" over all threads (each thread has its own data).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernel.inc"  // vec, kLanes, kPrefetchAhead and AddEntries, copied from sparse_ops.cc by loop_limit.py

namespace {

constexpr int NV = 4;  // the tile width of the large-batch paths (TileVectors)
constexpr int64_t W = NV * kLanes;

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// acc = acc * x + y on 12 independent vectors: no chain waits on another, so the FMA units set the rate.
int64_t Peak(int64_t reps, float seed, float* sink) {
  constexpr int kAcc = 12;
  vec acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = vec{} + seed * (i + 1);
  const vec x = vec{} + 0.999999f, y = vec{} + 1e-7f;
  for (int64_t r = 0; r < reps; ++r) {
    for (int i = 0; i < kAcc; ++i) acc[i] = acc[i] * x + y;  // the result is used below: nothing is elided
  }
  vec s = vec{};
  for (int i = 0; i < kAcc; ++i) s += acc[i];
  *sink = s[0];
  return reps * kAcc * kLanes;
}

struct Entries {
  std::vector<float> buf, vals, out;
  std::vector<int32_t> cols;
  std::vector<int64_t> starts;
};

// ROWS segments of SEG entries each, at sorted random columns of [0, n_cols), as a panel's segments are stored.
Entries MakeEntries(int64_t n_cols, int64_t seg, int64_t rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Entries e;
  e.buf.resize(n_cols * W + 16);
  for (auto& v : e.buf) v = u(rng);
  std::vector<int32_t> all(n_cols);
  for (int64_t c = 0; c < n_cols; ++c) all[c] = static_cast<int32_t>(c);
  for (int64_t r = 0; r < rows; ++r) {
    e.starts.push_back(static_cast<int64_t>(e.cols.size()));
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int32_t> row(all.begin(), all.begin() + std::min(seg, n_cols));
    std::sort(row.begin(), row.end());
    e.cols.insert(e.cols.end(), row.begin(), row.end());
  }
  e.starts.push_back(static_cast<int64_t>(e.cols.size()));
  e.vals.resize(e.cols.size());
  for (auto& v : e.vals) v = u(rng);
  e.out.resize(rows * W);
  return e;
}

// PanelTile's loop over one panel: per row, load its accumulators, add its segment, store them.
int64_t RunEntries(Entries& e, int64_t reps) {
  const int64_t rows = static_cast<int64_t>(e.starts.size()) - 1;
  // Aligned: the kernel's tile buffers are (Scratch), and vec loads assume it.
  float* buf = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(e.buf.data()) + 63) & ~uintptr_t{63});
  std::vector<vec> out(rows * NV);
  for (int64_t t = 0; t < reps; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      vec* o = out.data() + r * NV;
      vec a[NV], b[NV];
      for (int q = 0; q < NV; ++q) { a[q] = o[q]; b[q] = vec{}; }
      AddEntries<NV, false>(buf, e.cols.data(), nullptr, e.vals.data(), e.starts[r], e.starts[r + 1], 0, a, b);
      for (int q = 0; q < NV; ++q) o[q] = a[q] + b[q];
    }
  }
  std::memcpy(e.out.data(), out.data(), std::min(e.out.size(), out.size() * kLanes) * sizeof(float));
  return reps * static_cast<int64_t>(e.cols.size()) * W;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s peak|entries THREADS REPS [N_COLS SEG ROWS]\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const int threads = std::atoi(argv[2]);
  const int64_t reps = std::atoll(argv[3]);
  if (threads < 1 || reps < 1 || (mode != "peak" && mode != "entries") || (mode == "entries" && argc < 7)) {
    std::fprintf(stderr, "bad arguments\n");
    return 2;
  }
  const int64_t n_cols = mode == "entries" ? std::atoll(argv[4]) : 0, seg = mode == "entries" ? std::atoll(argv[5]) : 0,
                rows = mode == "entries" ? std::atoll(argv[6]) : 0;
  std::vector<Entries> data;
  for (int t = 0; t < threads && mode == "entries"; ++t) data.push_back(MakeEntries(n_cols, seg, rows, 7 + t));
  std::vector<float> sinks(threads * 16);
  for (int round = 0; round < 8; ++round) {  // the first is a warm-up; loop_limit.py drops it
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<int64_t> work(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        ready++;
        while (!go.load()) {
        }
        work[t] = mode == "peak" ? Peak(reps, 1.0f + t, &sinks[t * 16]) : RunEntries(data[t], reps);
      });
    while (ready.load() < threads) {
    }
    const double t0 = Seconds();
    go = true;
    for (auto& th : pool) th.join();
    const double dt = Seconds() - t0;
    int64_t total = 0;
    for (int64_t w : work) total += w;
    std::printf("%.9f %lld\n", dt, static_cast<long long>(total));
  }
  return 0;
}
