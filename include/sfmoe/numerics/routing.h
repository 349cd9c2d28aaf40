// The router's ordering and summation rules, shared by host and device so that every backend
// selects the same experts and writes the same probability bits (docs/router.md).
#pragma once

#include <stdint.h>

#include "sfmoe/numerics/bits.h"

namespace sfmoe {
namespace numerics {

// Selection order: a higher score first, then a lower index; a NaN score ranks below every
// number (a NaN logit is never preferred), NaNs among themselves by index. -0 and +0 tie.
template <class Real>
SFMOE_HD bool ranks_before(Real a, int64_t ia, Real b, int64_t ib) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a != b) return a > b;
  return ia < ib;
}

// An FP32 score as an unsigned key whose integer order is ranks_before's order on the scores
// (the index decides among equal keys): NaN -> 1, numbers -> their order-preserving bits (-0 made
// +0 first, so that the zeros tie), all >= 0x007FFFFF. Key 0 is left for "not a candidate".
SFMOE_HD uint32_t selection_key(float score) {
  if (f32_is_nan(score)) return 1u;
  uint32_t bits = f32_to_bits(score);
  if (bits == kF32SignMask) bits = 0;  // -0 -> +0
  return (bits & kF32SignMask) ? ~bits : bits | kF32SignMask;
}

// The score a selection key stands for (the inverse of selection_key; -0 comes back as +0, NaN
// as the canonical NaN): device selection carries keys and adds the scores they name.
SFMOE_HD float selection_key_score(uint32_t key) {
  if (key == 1u) return bits_to_f32(kF32CanonicalNanBits);
  return bits_to_f32((key & kF32SignMask) ? key & ~kF32SignMask : ~key);
}

// The order of a router sum over n values (the softmax's denominator): the values are cut into
// kRouterSumChunks consecutive chunks of router_chunk_size(n) values (the last ones shorter or
// empty); each chunk is summed in index order from +0; the 32 chunk sums are then combined by a
// butterfly: at widths 16, 8, 4, 2, 1 each chunk sum c_l becomes c_l + c_(l xor width), and the
// result is c_0. The device computes exactly this with a warp per token (one chunk per lane) and
// xor shuffles.
constexpr int kRouterSumChunks = 32;

SFMOE_HD int64_t router_chunk_size(int64_t n) {
  return (n + kRouterSumChunks - 1) / kRouterSumChunks;
}

// The combination of the chunk sums: a butterfly over the lane index (xor 4, 2, 1), the order
// the device's shuffles produce (each lane ends with the same bits: addition commutes).
template <class Real, class Add>
SFMOE_HD Real combine_router_chunks(const Real (&chunk)[kRouterSumChunks], Add add) {
  Real lanes[kRouterSumChunks];
  for (int l = 0; l < kRouterSumChunks; ++l) lanes[l] = chunk[l];
  for (int width = kRouterSumChunks / 2; width >= 1; width /= 2) {
    Real next[kRouterSumChunks];
    for (int l = 0; l < kRouterSumChunks; ++l) next[l] = add(lanes[l], lanes[l ^ width]);
    for (int l = 0; l < kRouterSumChunks; ++l) lanes[l] = next[l];
  }
  return lanes[0];
}

// The router sum of x[0..n) in the order above; `add` rounds once (numerics::add_rn for FP32).
template <class Real, class Add>
SFMOE_HD Real router_sum(const Real* x, int64_t n, Add add) {
  const int64_t size = router_chunk_size(n);
  Real chunk[kRouterSumChunks];
  for (int c = 0; c < kRouterSumChunks; ++c) {
    chunk[c] = Real(0);
    for (int64_t i = c * size; i < (c + 1) * size && i < n; ++i) chunk[c] = add(chunk[c], x[i]);
  }
  return combine_router_chunks(chunk, add);
}

}  // namespace numerics
}  // namespace sfmoe
