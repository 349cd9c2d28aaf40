// Work split over the host's cores for the CPU backend's heavy loops (the grouped GEMM): each
// index is handled by exactly one thread with the same arithmetic as a serial loop, so results do
// not depend on the thread count.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <thread>
#include <vector>

namespace sfmoe {
namespace cpu {

// fn(begin, end) over contiguous chunks of [0, count), on up to the hardware's threads; serial
// below `serial_below` items (a thread's start costs more than small loops).
template <class Fn>
void parallel_for(int64_t count, int64_t serial_below, Fn fn) {
  const int64_t hardware = static_cast<int64_t>(std::thread::hardware_concurrency());
  const int64_t threads = std::min<int64_t>(hardware > 0 ? hardware : 1, count / serial_below);
  if (threads <= 1) {
    if (count > 0) fn(int64_t{0}, count);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(threads - 1));
  const int64_t chunk = (count + threads - 1) / threads;
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t begin = t * chunk, end = std::min(count, begin + chunk);
    if (begin < end) workers.emplace_back(fn, begin, end);
  }
  fn(int64_t{0}, std::min(count, chunk));
  for (std::thread& w : workers) w.join();
}

}  // namespace cpu
}  // namespace sfmoe
