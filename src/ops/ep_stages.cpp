// The EXTERNAL transport's stages (src/ops/ep_stages.h).
#include "src/ops/ep_stages.h"

#include "src/common/error.h"

namespace sfmoe {
namespace ops {

sfmoe_status EpStagedExchange::meet(bool all_to_all, const void* send, void* recv, int64_t bytes,
                                    void* stream) {
  const int64_t i = at_++;
  if (i >= static_cast<int64_t>(expected_.size()) || expected_[i].all_to_all != all_to_all ||
      expected_[i].bytes != bytes) {
    return report(SFMOE_ERROR_INTERNAL,
                  "the expert-parallel stages: collective %lld is an %s of %lld bytes, not the "
                  "planned one",
                  static_cast<long long>(i), all_to_all ? "all-to-all" : "all-gather",
                  static_cast<long long>(bytes));
  }
  const EpCollective& c = expected_[i];
  if (i == stage_ && send != sent_) {
    SFMOE_RETURN_IF_ERROR(
        backend_.copy(sent_, send, static_cast<size_t>(c.sent_bytes(world_)), stream));
  }
  if (i + 1 == stage_ && recv != received_) {
    SFMOE_RETURN_IF_ERROR(
        backend_.copy(recv, received_, static_cast<size_t>(c.received_bytes(world_)), stream));
  }
  return SFMOE_SUCCESS;
}

sfmoe_status EpStagedExchange::finish() const {
  if (at_ == static_cast<int64_t>(expected_.size())) return SFMOE_SUCCESS;
  return report(SFMOE_ERROR_INTERNAL,
                "the expert-parallel stages: %lld collectives met, %lld planned",
                static_cast<long long>(at_), static_cast<long long>(expected_.size()));
}

}  // namespace ops
}  // namespace sfmoe
