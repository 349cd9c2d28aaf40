// The EXTERNAL transport's stages (docs/ep.md, "The EXTERNAL transport"): one rank's per-rank EP
// work (src/cpu/ep_exchange.cpp, src/cuda/ep/ep_exchange.cu) cut at its collectives, one stage a
// call, the caller moving the bytes between two calls with its own collectives (XLA's in a JAX
// shard_map). Stage i runs the work between collective i - 1 and collective i: it reads what
// collective i - 1 delivered (`received`) and leaves what collective i sends (`sent`).
#pragma once

#include <stdint.h>

#include <vector>

#include "src/common/ep_args.h"
#include "src/ops/backend.h"

namespace sfmoe {
namespace ops {

// One collective of a rank: an all-gather (a rank sends `bytes`, receives world blocks of
// `bytes`, block q rank q's) or an all-to-all (a rank sends and receives world blocks of `bytes`,
// block q to / from rank q).
struct EpCollective {
  bool all_to_all = false;
  int64_t bytes = 0;
  int64_t sent_bytes(int64_t world) const { return all_to_all ? world * bytes : bytes; }
  int64_t received_bytes(int64_t world) const { return world * bytes; }
};

// An EpExchange for one stage of a sequence whose collectives are `expected`: the work before
// collective `stage` and after collective stage - 1 runs (runs()); at collective `stage` the send
// buffer is copied to `sent` (unless it is `sent`), at collective stage - 1 `received` is copied to
// the receive buffer (unless it is `received`). A collective other than the expected one is an
// internal error, reported; so is a sequence that ends before its last collective (finish()).
class EpStagedExchange final : public EpExchange {
 public:
  EpStagedExchange(const Backend& backend, const std::vector<EpCollective>& expected, int64_t world,
                   int64_t stage, void* sent, const void* received)
      : backend_(backend),
        expected_(expected),
        world_(world),
        stage_(stage),
        sent_(sent),
        received_(received) {}

  sfmoe_status all_gather(const void* send, void* recv, int64_t bytes, void* stream) override {
    return meet(false, send, recv, bytes, stream);
  }
  sfmoe_status all_to_all(const void* send, void* recv, int64_t pair_bytes, void* stream) override {
    return meet(true, send, recv, pair_bytes, stream);
  }
  bool runs() const override { return at_ == stage_; }
  sfmoe_status finish() const;

 private:
  sfmoe_status meet(bool all_to_all, const void* send, void* recv, int64_t bytes, void* stream);

  const Backend& backend_;
  const std::vector<EpCollective>& expected_;
  int64_t world_, stage_;
  void* sent_;
  const void* received_;
  int64_t at_ = 0;  // the collectives met so far
};

}  // namespace ops
}  // namespace sfmoe
