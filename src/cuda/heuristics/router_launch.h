// The router's launch choices, from its configuration and which optional buffers a call passes
// (docs/router.md, docs/KERNEL_NOTES.md router).
#pragma once

#include "src/common/router_args.h"

namespace sfmoe {
namespace cuda {

// Sigmoid scores with no bias, expert groups or losses and k below a warp's 32 lanes: the top k is
// read from the logits' order (the sigmoid is monotone), so a token takes k + 1 sigmoids instead
// of E (v9: 14.5 us against 15.9 for the general path, FP32 [8192, 256], top 8). The softmax needs
// every score for its denominator; a bias breaks the logits' order.
inline bool router_takes_logit_order(const RouterConfig& c, bool bias, bool losses) {
  return c.sigmoid && !c.softmax_after_topk && !bias && c.num_groups <= 1 && !losses &&
         c.top_k < 32;
}

}  // namespace cuda
}  // namespace sfmoe
