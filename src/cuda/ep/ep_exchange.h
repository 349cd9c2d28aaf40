// Expert parallelism with one rank a process (src/cuda/ep/ep_exchange.cu): the backend's four EP
// operations when their arguments carry an EpRankExchange, and the NCCL exchange
// (src/cuda/ep/nccl_exchange.cpp).
#pragma once

#include <stdint.h>

#include <memory>
#include <vector>

#include "src/common/ep_args.h"

namespace sfmoe {
namespace cuda {

sfmoe_status ep_route_exchange(const EpRouteArgs& args, void* stream);
sfmoe_status ep_scatter_exchange(const EpScatterArgs& args, void* stream);
sfmoe_status ep_gather_exchange(const EpGatherArgs& args, void* stream);
sfmoe_status ep_slot_values_exchange(const EpSlotValuesArgs& args, void* stream);

// NCCL (loaded on first use): the 128 bytes of a fresh ncclUniqueId; an exchange over a
// communicator made from one (every rank calls this at set-up with the same id), or over a
// communicator the caller lends (borrowed_comm, an ncclComm_t of world ranks with this one as
// `rank`).
sfmoe_status nccl_unique_id(uint8_t* out);
sfmoe_status nccl_exchange_create(const uint8_t* unique_id, void* borrowed_comm, int32_t world,
                                  int32_t rank, int32_t device, std::unique_ptr<EpExchange>* out);

// A per-rank group's device side: its exchange and the staging blocks of EpRankExchange, held
// from creation to destruction.
class EpRankTransport {
 public:
  static sfmoe_status create(int64_t world, int64_t rank, int64_t pair_rows,
                             int64_t staging_row_bytes, int64_t scale_bytes, int32_t device,
                             std::unique_ptr<EpExchange> exchange,
                             std::unique_ptr<EpRankTransport>* out);
  // The device bytes create() allocates.
  static int64_t staging_bytes(int64_t world, int64_t pair_rows, int64_t staging_row_bytes,
                               int64_t scale_bytes);
  ~EpRankTransport();
  const EpRankExchange* view() const { return &view_; }

 private:
  EpRankTransport() = default;
  EpRankExchange view_{};
  std::unique_ptr<EpExchange> exchange_;
  std::vector<void*> buffers_;
  int32_t device_ = 0;
};

}  // namespace cuda
}  // namespace sfmoe
