// Benchmark harness: CUDA-event timing after warm-up, the median of many runs, buffers rotated so
// that repeated runs do not measure the L2 cache, and one JSON record per measurement.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace sfmoe {
namespace bench {

#define BENCH_CUDA(call)                                                                          \
  do {                                                                                            \
    const cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                                               \
    }                                                                                             \
  } while (0)

struct Timing {
  double median_ms, min_ms, max_ms;
  int runs;
};

// Times `run(i)` (i = run index, for rotating buffers) with CUDA events on `stream`: `warmup`
// untimed runs, then `runs` timed ones, each bracketed by its own events.
inline Timing time_runs(const std::function<void(int)>& run, cudaStream_t stream, int warmup = 5,
                        int runs = 25) {
  for (int i = 0; i < warmup; ++i) run(i);
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<cudaEvent_t> events(2 * runs);
  for (auto& e : events) BENCH_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < runs; ++i) {
    BENCH_CUDA(cudaEventRecord(events[2 * i], stream));
    run(warmup + i);
    BENCH_CUDA(cudaEventRecord(events[2 * i + 1], stream));
  }
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ms(runs);
  for (int i = 0; i < runs; ++i) {
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, events[2 * i], events[2 * i + 1]));
    ms[i] = t;
  }
  for (auto& e : events) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return Timing{ms[runs / 2], ms.front(), ms.back(), runs};
}

// How many copies of a working set to rotate through so that consecutive runs touch more than
// twice the L2 cache (at least 1).
inline int rotation_count(size_t bytes_per_set) {
  int device = 0, l2 = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
  const size_t need = 2 * static_cast<size_t>(l2);
  return bytes_per_set >= need ? 1 : static_cast<int>((need + bytes_per_set - 1) / bytes_per_set);
}

// Collects records and writes them as a JSON array to $SFMOE_BENCH_JSON (if set) at the end.
class JsonLog {
 public:
  void add(const std::string& record) { records_.push_back(record); }
  ~JsonLog() {
    const char* path = std::getenv("SFMOE_BENCH_JSON");
    if (!path || !*path) return;
    FILE* f = std::fopen(path, "w");
    if (!f) return;
    std::fprintf(f, "[\n");
    for (size_t i = 0; i < records_.size(); ++i) {
      std::fprintf(f, "  %s%s\n", records_[i].c_str(), i + 1 < records_.size() ? "," : "");
    }
    std::fprintf(f, "]\n");
    std::fclose(f);
  }

 private:
  std::vector<std::string> records_;
};

// The device-to-device copy ceiling measured on our H200 (../shared/GPU.md, 2026-11-29).
constexpr double kReferenceCopyTBps = 4.17;

}  // namespace bench
}  // namespace sfmoe
