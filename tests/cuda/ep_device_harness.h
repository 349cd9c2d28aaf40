// The expert-parallel device tests' harness (tests/cuda/test_ep_device.cu, the loopback;
// tests/cuda/test_ep_exchange_device.cu, the per-rank transport): the cases, every buffer of every
// rank on the host and on the device poisoned alike, and the calls of one step.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "sfmoe/ep.h"
#include "sfmoe/numerics.h"
#include "tests/cpp/host_descriptors.h"
#include "tests/cpp/numerics_cases.h"
#include "tests/cuda/gpu_test_util.h"

namespace sfmoe {
namespace testing {

constexpr sfmoe_dtype kBytes = SFMOE_DTYPE_FP8_E4M3;

struct DeviceEpCase {
  std::string name;
  int32_t world;
  int64_t experts_per_rank, max_tokens, top_k, hidden, alignment, capacity;
  sfmoe_dtype payload;
  bool skewed, empty_ranks;
  sfmoe_ep_overflow overflow = SFMOE_EP_OVERFLOW_DROP;
  int64_t spill = 0;
  sfmoe_scaling scaling = SFMOE_SCALING_NONE;  // FP8 payloads: dispatch only (with scales)
  int64_t pair = 0;  // > 0: the pair capacity (per-rank transports and the host loopback)
  bool fp8() const { return scaling != SFMOE_SCALING_NONE; }
};

// One byte buffer on both sides.
struct Both {
  std::vector<uint8_t> host;
  DeviceBuffer<uint8_t> device;
  explicit Both(std::vector<uint8_t> start) : host(std::move(start)), device(host.size()) {
    EXPECT_EQ(device.upload(host), cudaSuccess);
  }
  void* on(sfmoe_memory m) { return m == SFMOE_MEMORY_HOST ? host.data() : device.ptr; }
  bool same() const {
    const std::vector<uint8_t> got = device.download();
    return got.size() == host.size() &&
           (host.empty() || memcmp(got.data(), host.data(), host.size()) == 0);
  }
  void reset_to(const std::vector<uint8_t>& bytes) {
    host = bytes;
    EXPECT_EQ(device.upload(host), cudaSuccess);
  }
};

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) memcpy(b.data(), v.data(), b.size());
  return b;
}

inline std::vector<int32_t> route(std::mt19937_64& rng, int64_t tokens, int64_t E, int64_t k,
                                  bool skewed) {
  std::vector<int32_t> ids(tokens * k);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> weight(E);
    for (int64_t e = 0; e < E; ++e) weight[e] = skewed ? 1.0 / (e + 1) : 1.0;
    for (int64_t i = 0; i < k; ++i) {
      std::discrete_distribution<int32_t> pick(weight.begin(), weight.end());
      const int32_t e = pick(rng);
      ids[t * k + i] = e;
      weight[e] = 0.0;
    }
  }
  return ids;
}

// Every buffer of every rank, on both sides, and the three calls.
struct EpRun {
  DeviceEpCase c;
  sfmoe_ep_plan plan;
  std::vector<int64_t> tokens;
  // (deques: a Both holds a device buffer and does not move)
  std::deque<Both> x, ids, probs, received, offsets, handle, kept, routed, dropped, y, out, back,
      d_out, d_rows, d_probs, token_scales, received_scales;

  EpRun(const DeviceEpCase& c_, const sfmoe_ep_plan& p, std::mt19937_64& rng) : c(c_), plan(p) {
    // (a per-rank group's handle is the larger: its plan sizes the buffers, receive_rows agree)
    const int64_t R = c.world, H = c.hidden, k = c.top_k, El = c.experts_per_rank, E = R * El;
    const int elem = sfmoe_dtype_bits(c.payload) / 8;
    const int64_t scale_row = plan.scale_columns * sfmoe_dtype_bits(plan.scale_dtype) / 8;
    const std::vector<uint32_t> special = special_f32_bits();
    for (int64_t r = 0; r < R; ++r) {
      int64_t T =
          c.empty_ranks && r % 3 == 1 ? 0 : static_cast<int64_t>(rng() % (c.max_tokens + 1));
      if (r == 0) T = c.max_tokens;
      tokens.push_back(T);
      std::vector<uint8_t> xs(T * H * elem);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int64_t i = 0; i < T * H; ++i) {
        const float v =
            i % 31 == 5 ? numerics::bits_to_f32(special[(i / 31) % special.size()]) : normal(rng);
        if (elem == 1) {
          xs[i] = static_cast<uint8_t>(rng());  // every FP8 code, NaNs among them
        } else if (elem == 2) {
          const uint16_t code =
              c.payload == SFMOE_DTYPE_BF16 ? numerics::f32_to_bf16(v) : numerics::f32_to_fp16(v);
          memcpy(&xs[i * 2], &code, 2);
        } else {
          memcpy(&xs[i * 4], &v, 4);
        }
      }
      x.emplace_back(xs);
      ids.emplace_back(bytes_of(route(rng, T, E, k, c.skewed)));
      std::vector<float> p(T * k);
      for (float& v : p) v = static_cast<float>(rng() % 1000) / 999.0f;
      probs.emplace_back(bytes_of(p));
      received.emplace_back(std::vector<uint8_t>(plan.receive_rows * H * elem, 0xA5));
      offsets.emplace_back(std::vector<uint8_t>(plan.rounds * (El + 1) * 8, 0xA5));
      handle.emplace_back(std::vector<uint8_t>(plan.handle_bytes, 0xA5));
      kept.emplace_back(std::vector<uint8_t>(plan.rounds * El * 8, 0xA5));
      std::vector<uint8_t> ts(T * scale_row);
      for (uint8_t& b : ts) b = static_cast<uint8_t>(rng());
      token_scales.emplace_back(ts);
      received_scales.emplace_back(std::vector<uint8_t>(plan.receive_rows * scale_row, 0xA5));
      routed.emplace_back(std::vector<uint8_t>(El * 8, 0xA5));
      dropped.emplace_back(std::vector<uint8_t>(E * 8, 0xA5));
      std::vector<uint8_t> ys(plan.receive_rows * H * elem);
      for (uint8_t& b : ys) b = static_cast<uint8_t>(rng() % 64);  // small finite values
      y.emplace_back(ys);
      out.emplace_back(std::vector<uint8_t>(T * H * elem, 0xA5));
      back.emplace_back(std::vector<uint8_t>(T * H * elem, 0xA5));
      std::vector<uint8_t> ds(T * H * elem);
      for (uint8_t& b : ds) b = static_cast<uint8_t>(rng() % 64);
      d_out.emplace_back(ds);
      d_rows.emplace_back(std::vector<uint8_t>(plan.receive_rows * H * elem, 0xA5));
      d_probs.emplace_back(std::vector<uint8_t>(T * k * 4, 0xA5));
    }
  }

  // Ranks [first, first + count) of each buffer (a per-rank group's call takes one).
  std::vector<sfmoe_tensor> list_of(std::deque<Both>& b, sfmoe_memory m, sfmoe_dtype dtype,
                                    std::vector<int64_t> (*shape)(const EpRun&, int64_t),
                                    int64_t first, int64_t count) {
    std::vector<sfmoe_tensor> out_list;
    for (int64_t r = first; r < first + count; ++r) {
      const std::vector<int64_t> s = shape(*this, r);
      sfmoe_tensor t = tensor_in(m, b[r].on(m), dtype, {s[0]});
      t.ndim = static_cast<int32_t>(s.size());
      for (size_t i = 0; i < s.size(); ++i) t.shape[i] = s[i];
      out_list.push_back(t);
    }
    return out_list;
  }

  // dispatch, combine (with and without probs) and combine's backward on memory m, for every
  // rank (a loopback group) or rank `only` (a per-rank group).
  sfmoe_status step(const sfmoe_ep_group* group, sfmoe_memory m, cudaStream_t stream,
                    int64_t only = -1) {
    const int64_t first = only < 0 ? 0 : only, count = only < 0 ? c.world : 1;
    auto list = [&](std::deque<Both>& b, sfmoe_memory mm, sfmoe_dtype dtype,
                    std::vector<int64_t> (*shape)(const EpRun&, int64_t)) {
      return list_of(b, mm, dtype, shape, first, count);
    };
    const sfmoe_dtype pay = c.payload;
    auto tokens_shape = [](const EpRun& e, int64_t r) {
      return std::vector<int64_t>{e.tokens[r], e.c.hidden};
    };
    auto slots_shape = [](const EpRun& e, int64_t r) {
      return std::vector<int64_t>{e.tokens[r], e.c.top_k};
    };
    auto rows_shape = [](const EpRun& e, int64_t) {
      return std::vector<int64_t>{e.plan.receive_rows, e.c.hidden};
    };
    auto offsets_shape = [](const EpRun& e, int64_t) {
      return std::vector<int64_t>{e.plan.rounds * (e.c.experts_per_rank + 1)};
    };
    auto local_shape = [](const EpRun& e, int64_t) {
      return std::vector<int64_t>{e.c.experts_per_rank};
    };
    auto groups_shape = [](const EpRun& e, int64_t) {
      return std::vector<int64_t>{e.plan.rounds * e.c.experts_per_rank};
    };
    auto token_scales_shape = [](const EpRun& e, int64_t r) {
      return std::vector<int64_t>{e.tokens[r], e.plan.scale_columns};
    };
    auto received_scales_shape = [](const EpRun& e, int64_t) {
      return std::vector<int64_t>{e.plan.receive_rows, e.plan.scale_columns};
    };
    auto global_shape = [](const EpRun& e, int64_t) {
      return std::vector<int64_t>{e.c.world * e.c.experts_per_rank};
    };
    auto handle_shape = [](const EpRun& e, int64_t) {
      return std::vector<int64_t>{e.plan.handle_bytes};
    };
    std::vector<sfmoe_tensor> t_x = list(x, m, pay, tokens_shape),
                              t_ids = list(ids, m, SFMOE_DTYPE_INT32, slots_shape),
                              t_rec = list(received, m, pay, rows_shape),
                              t_off = list(offsets, m, SFMOE_DTYPE_INT64, offsets_shape),
                              t_handle = list(handle, m, kBytes, handle_shape),
                              t_kept = list(kept, m, SFMOE_DTYPE_INT64, groups_shape),
                              t_tscales =
                                  list(token_scales, m, plan.scale_dtype, token_scales_shape),
                              t_rscales =
                                  list(received_scales, m, plan.scale_dtype, received_scales_shape),
                              t_routed = list(routed, m, SFMOE_DTYPE_INT64, local_shape),
                              t_dropped = list(dropped, m, SFMOE_DTYPE_INT64, global_shape),
                              t_y = list(y, m, pay, rows_shape),
                              t_probs = list(probs, m, SFMOE_DTYPE_FP32, slots_shape),
                              t_out = list(out, m, pay, tokens_shape),
                              t_back = list(back, m, pay, tokens_shape),
                              t_dout = list(d_out, m, pay, tokens_shape),
                              t_drows = list(d_rows, m, pay, rows_shape),
                              t_dprobs = list(d_probs, m, SFMOE_DTYPE_FP32, slots_shape);
    auto ptrs = [](std::vector<sfmoe_tensor>& v) {
      std::vector<const sfmoe_tensor*> p;
      for (sfmoe_tensor& t : v) p.push_back(&t);
      return p;
    };
    auto p_x = ptrs(t_x), p_ids = ptrs(t_ids), p_rec = ptrs(t_rec), p_off = ptrs(t_off),
         p_handle = ptrs(t_handle), p_kept = ptrs(t_kept), p_routed = ptrs(t_routed),
         p_dropped = ptrs(t_dropped), p_y = ptrs(t_y), p_probs = ptrs(t_probs), p_out = ptrs(t_out),
         p_back = ptrs(t_back), p_dout = ptrs(t_dout), p_drows = ptrs(t_drows),
         p_dprobs = ptrs(t_dprobs), p_tscales = ptrs(t_tscales), p_rscales = ptrs(t_rscales);
    sfmoe_ep_dispatch_args d = sfmoe_ep_dispatch_args_init();
    d.tokens = p_x.data();
    d.topk_ids = p_ids.data();
    d.received = p_rec.data();
    d.group_offsets = p_off.data();
    d.handle = p_handle.data();
    d.tokens_per_expert = p_kept.data();
    d.routed_per_expert = p_routed.data();
    d.dropped_per_expert = p_dropped.data();
    d.stream = stream;
    if (c.fp8()) {
      d.token_scales = p_tscales.data();
      d.received_scales = p_rscales.data();
    }
    const sfmoe_status dispatched = sfmoe_ep_dispatch(group, &d);
    if (dispatched != SFMOE_SUCCESS || c.fp8()) return dispatched;
    sfmoe_ep_combine_args cb = sfmoe_ep_combine_args_init();
    cb.rows = p_y.data();
    cb.probs = p_probs.data();
    cb.handle = p_handle.data();
    cb.out = p_out.data();
    cb.stream = stream;
    const sfmoe_status combined = sfmoe_ep_combine(group, &cb);
    if (combined != SFMOE_SUCCESS) return combined;
    cb.rows = p_rec.data();
    cb.probs = nullptr;
    cb.out = p_back.data();
    const sfmoe_status backward = sfmoe_ep_combine(group, &cb);
    if (backward != SFMOE_SUCCESS) return backward;
    sfmoe_ep_combine_backward_args bb = sfmoe_ep_combine_backward_args_init();
    bb.d_out = p_dout.data();
    bb.rows = p_y.data();
    bb.probs = p_probs.data();
    bb.handle = p_handle.data();
    bb.d_rows = p_drows.data();
    bb.d_probs = p_dprobs.data();
    bb.stream = stream;
    return sfmoe_ep_combine_backward(group, &bb);
  }

  // Every output equal on both sides (the handle too: the same routing, byte for byte).
  void expect_same(const std::string& what) {
    for (int64_t r = 0; r < c.world; ++r) {
      SCOPED_TRACE(what + " rank " + std::to_string(r));
      const std::string at = what + " rank " + std::to_string(r);
      EXPECT_TRUE(received[r].same()) << at << " received";
      EXPECT_TRUE(received_scales[r].same()) << at << " received scales";
      EXPECT_TRUE(offsets[r].same()) << at << " offsets";
      EXPECT_TRUE(kept[r].same()) << at << " kept";
      EXPECT_TRUE(routed[r].same()) << at << " routed";
      EXPECT_TRUE(dropped[r].same()) << at << " dropped";
      EXPECT_TRUE(out[r].same()) << at << " combine";
      EXPECT_TRUE(back[r].same()) << at << " dispatch backward";
      EXPECT_TRUE(d_rows[r].same()) << at << " d rows";
      EXPECT_TRUE(d_probs[r].same()) << at << " d probs";
    }
  }
};

inline std::vector<DeviceEpCase> device_cases() {
  return {
      {"R 1 bf16, worst case", 1, 16, 300, 4, 264, 16, SFMOE_EP_CAPACITY_WORST_CASE,
       SFMOE_DTYPE_BF16, false, false},
      {"R 2 fp32, capacity below demand", 2, 5, 129, 3, 40, 1, 200, SFMOE_DTYPE_FP32, true, false},
      {"R 4 bf16, skewed, tight capacity", 4, 8, 257, 8, 72, 32, 300, SFMOE_DTYPE_BF16, true,
       false},
      {"R 8 bf16, empty ranks", 8, 4, 100, 6, 33, 8, 90, SFMOE_DTYPE_BF16, false, true},
      {"R 4 bf16, spill, both rounds bind", 4, 6, 211, 4, 136, 16, 250, SFMOE_DTYPE_BF16, true,
       false, SFMOE_EP_OVERFLOW_SPILL, 120},
      {"R 8 bf16, spill of the worst case", 8, 2, 64, 3, 24, 1, 40, SFMOE_DTYPE_BF16, true, true,
       SFMOE_EP_OVERFLOW_SPILL, SFMOE_EP_CAPACITY_WORST_CASE},
      {"R 4 fp8 e4m3 1x128, spill", 4, 4, 150, 4, 200, 16, 160, SFMOE_DTYPE_FP8_E4M3, true, false,
       SFMOE_EP_OVERFLOW_SPILL, 80, SFMOE_SCALING_BLOCK_1X128},
      {"R 2 fp8 e4m3 per-tensor", 2, 8, 97, 2, 256, 32, 60, SFMOE_DTYPE_FP8_E4M3, false, false,
       SFMOE_EP_OVERFLOW_DROP, 0, SFMOE_SCALING_TENSOR},
      {"R 8 fp8 e5m2 mxfp8, odd H", 8, 2, 77, 4, 7 * 32 + 8, 32, SFMOE_EP_CAPACITY_WORST_CASE,
       SFMOE_DTYPE_FP8_E5M2, true, true, SFMOE_EP_OVERFLOW_DROP, 0, SFMOE_SCALING_MX_1X32},
  };
}

inline sfmoe_ep_config config_of(const DeviceEpCase& c) {
  sfmoe_ep_config config = sfmoe_ep_config_init();
  config.world_size = c.world;
  config.experts_per_rank = c.experts_per_rank;
  config.max_tokens_per_rank = c.max_tokens;
  config.top_k = c.top_k;
  config.hidden = c.hidden;
  config.payload = c.payload;
  config.row_alignment = c.alignment;
  config.receive_capacity = c.capacity;
  config.overflow = c.overflow;
  config.spill_capacity = c.spill;
  config.payload_scaling = c.scaling;
  config.pair_capacity = c.pair > 0 ? c.pair : SFMOE_EP_CAPACITY_WORST_CASE;
  return config;
}

inline sfmoe_ep_group* make_group(const DeviceEpCase& c, sfmoe_memory m) {
  const sfmoe_ep_config config = config_of(c);
  sfmoe_ep_group* g = nullptr;
  EXPECT_EQ(sfmoe_ep_group_create(&config, m, 0, &g), SFMOE_SUCCESS) << sfmoe_last_error();
  return g;
}

}  // namespace testing
}  // namespace sfmoe
