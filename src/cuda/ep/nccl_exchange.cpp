// The NCCL exchange (src/cuda/ep/ep_exchange.h): NCCL is loaded when the first NCCL group is
// created (dlopen of libnccl.so.2), so the library loads and runs everything else on machines
// without it; the collectives are NCCL's own, enqueued on the caller's stream, so a step with
// them captures in one CUDA graph. Also the staging of a per-rank group (EpRankTransport).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <string.h>

#include <mutex>

#include "src/common/error.h"
#include "src/cuda/common/cuda_check.h"
#include "src/cuda/ep/ep_exchange.h"

namespace sfmoe {
namespace cuda {
namespace {

// The NCCL calls used, resolved once from the shared library.
struct NcclApi {
  ncclResult_t (*get_unique_id)(ncclUniqueId*);
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  ncclResult_t (*comm_count)(const ncclComm_t, int*);
  ncclResult_t (*comm_user_rank)(const ncclComm_t, int*);
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*group_start)();
  ncclResult_t (*group_end)();
  const char* (*error_string)(ncclResult_t);
  const char* missing;  // why NCCL is not usable, or NULL
};

template <class F>
bool resolve(void* library, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(library, name));
  return *out != nullptr;
}

const NcclApi& nccl() {
  static NcclApi api{};
  static std::once_flag once;
  std::call_once(once, [] {
    void* library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (library == nullptr) library = dlopen("libnccl.so", RTLD_NOW | RTLD_GLOBAL);
    if (library == nullptr) {
      api.missing = "libnccl.so.2 was not found (install NCCL or put it on LD_LIBRARY_PATH)";
      return;
    }
    const bool ok = resolve(library, "ncclGetUniqueId", &api.get_unique_id) &&
                    resolve(library, "ncclCommInitRank", &api.comm_init_rank) &&
                    resolve(library, "ncclCommDestroy", &api.comm_destroy) &&
                    resolve(library, "ncclCommCount", &api.comm_count) &&
                    resolve(library, "ncclCommUserRank", &api.comm_user_rank) &&
                    resolve(library, "ncclAllGather", &api.all_gather) &&
                    resolve(library, "ncclSend", &api.send) &&
                    resolve(library, "ncclRecv", &api.recv) &&
                    resolve(library, "ncclGroupStart", &api.group_start) &&
                    resolve(library, "ncclGroupEnd", &api.group_end) &&
                    resolve(library, "ncclGetErrorString", &api.error_string);
    if (!ok) api.missing = "libnccl.so.2 lacks a function sfmoe calls (NCCL 2.19 or newer needed)";
  });
  return api;
}

sfmoe_status nccl_fail(const char* what, ncclResult_t result) {
  return report(SFMOE_ERROR_COMMUNICATION, "%s failed: %s", what, nccl().error_string(result));
}

#define SFMOE_NCCL_RETURN_IF_ERROR(call)                          \
  do {                                                            \
    const ncclResult_t result_ = (call);                          \
    if (result_ != ncclSuccess) return nccl_fail(#call, result_); \
  } while (0)

class NcclExchange final : public EpExchange {
 public:
  NcclExchange(ncclComm_t comm, bool owned, int world)
      : comm_(comm), owned_(owned), world_(world) {}
  ~NcclExchange() override {
    if (owned_) (void)nccl().comm_destroy(comm_);
  }
  sfmoe_status all_gather(const void* send, void* recv, int64_t bytes, void* stream) override {
    SFMOE_NCCL_RETURN_IF_ERROR(nccl().all_gather(send, recv, static_cast<size_t>(bytes), ncclUint8,
                                                 comm_, static_cast<cudaStream_t>(stream)));
    return SFMOE_SUCCESS;
  }
  sfmoe_status all_to_all(const void* send, void* recv, int64_t pair_bytes, void* stream) override {
    const NcclApi& api = nccl();
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const size_t n = static_cast<size_t>(pair_bytes);
    SFMOE_NCCL_RETURN_IF_ERROR(api.group_start());
    ncclResult_t result = ncclSuccess;
    for (int q = 0; q < world_ && result == ncclSuccess; ++q) {
      result = api.send(static_cast<const uint8_t*>(send) + q * n, n, ncclUint8, q, comm_, s);
      if (result == ncclSuccess) {
        result = api.recv(static_cast<uint8_t*>(recv) + q * n, n, ncclUint8, q, comm_, s);
      }
    }
    const ncclResult_t ended = api.group_end();
    if (result != ncclSuccess) return nccl_fail("ncclSend / ncclRecv", result);
    if (ended != ncclSuccess) return nccl_fail("ncclGroupEnd", ended);
    return SFMOE_SUCCESS;
  }

 private:
  ncclComm_t comm_;
  bool owned_;
  int world_;
};

}  // namespace

sfmoe_status nccl_unique_id(uint8_t* out) {
  const NcclApi& api = nccl();
  if (api.missing != nullptr) return report(SFMOE_ERROR_UNSUPPORTED, "%s", api.missing);
  ncclUniqueId id;
  SFMOE_NCCL_RETURN_IF_ERROR(api.get_unique_id(&id));
  memcpy(out, id.internal, sizeof(id.internal));
  return SFMOE_SUCCESS;
}

sfmoe_status nccl_exchange_create(const uint8_t* unique_id, void* borrowed_comm, int32_t world,
                                  int32_t rank, int32_t device, std::unique_ptr<EpExchange>* out) {
  const NcclApi& api = nccl();
  if (api.missing != nullptr) return report(SFMOE_ERROR_UNSUPPORTED, "%s", api.missing);
  ncclComm_t comm = static_cast<ncclComm_t>(borrowed_comm);
  if (comm == nullptr) {
    ncclUniqueId id;
    memcpy(id.internal, unique_id, sizeof(id.internal));
    int previous = 0;
    SFMOE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous));
    SFMOE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    // (blocks until every rank has called it: set-up, not a step)
    const ncclResult_t made = api.comm_init_rank(&comm, world, id, rank);
    (void)cudaSetDevice(previous);
    if (made != ncclSuccess) return nccl_fail("ncclCommInitRank", made);
  } else {
    int count = 0, user_rank = 0;
    SFMOE_NCCL_RETURN_IF_ERROR(api.comm_count(comm, &count));
    SFMOE_NCCL_RETURN_IF_ERROR(api.comm_user_rank(comm, &user_rank));
    if (count != world || user_rank != rank) {
      return report(SFMOE_ERROR_INVALID_ARGUMENT,
                    "the NCCL communicator holds %d ranks with this one as rank %d; the group "
                    "says world_size %d, rank %d",
                    count, user_rank, static_cast<int>(world), static_cast<int>(rank));
    }
  }
  out->reset(new NcclExchange(comm, borrowed_comm == nullptr, world));
  return SFMOE_SUCCESS;
}

EpRankTransport::~EpRankTransport() {
  int previous = 0;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(device_);
  for (void* p : buffers_) (void)cudaFree(p);
  (void)cudaSetDevice(previous);
  exchange_.reset();  // (the communicator goes after the buffers it might still be reading)
}

sfmoe_status EpRankTransport::create(int64_t world, int64_t rank, int64_t pair_rows,
                                     int64_t staging_row_bytes, int64_t scale_bytes, int32_t device,
                                     std::unique_ptr<EpExchange> exchange,
                                     std::unique_ptr<EpRankTransport>* out) {
  std::unique_ptr<EpRankTransport> t(new EpRankTransport());
  t->device_ = device;
  t->exchange_ = std::move(exchange);
  EpRankExchange& x = t->view_;
  x.exchange = t->exchange_.get();
  x.rank = rank;
  x.pair_rows = pair_rows;
  x.staging_row_bytes = staging_row_bytes;
  int previous = 0;
  SFMOE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous));
  SFMOE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  const int64_t blocks = world * pair_rows;
  cudaError_t error = cudaSuccess;
  auto allocate = [&](int64_t bytes, void** p) {
    *p = nullptr;
    if (error != cudaSuccess || bytes == 0) return;
    error = cudaMalloc(p, static_cast<size_t>(bytes));
    if (error == cudaSuccess) t->buffers_.push_back(*p);
    // Cleared once here (creation may synchronize): a block's rows past what a pair sends travel
    // too, and defined bytes keep every exchange free of uninitialized reads (initcheck).
    if (error == cudaSuccess) error = cudaMemset(*p, 0, static_cast<size_t>(bytes));
  };
  void* send_values = nullptr;
  void* recv_values = nullptr;
  void* send_index = nullptr;
  allocate(blocks * staging_row_bytes, &x.send_rows);
  allocate(blocks * staging_row_bytes, &x.recv_rows);
  allocate(blocks * scale_bytes, &x.send_scales);
  allocate(blocks * scale_bytes, &x.recv_scales);
  allocate(blocks * 4, &send_values);
  allocate(blocks * 4, &recv_values);
  allocate(blocks * 8, &send_index);
  (void)cudaSetDevice(previous);
  if (error != cudaSuccess) return cuda_fail("allocating the expert-parallel staging", error);
  x.send_values = static_cast<float*>(send_values);
  x.recv_values = static_cast<float*>(recv_values);
  x.send_index = static_cast<int64_t*>(send_index);
  *out = std::move(t);
  return SFMOE_SUCCESS;
}

int64_t EpRankTransport::staging_bytes(int64_t world, int64_t pair_rows, int64_t staging_row_bytes,
                                       int64_t scale_bytes) {
  return world * pair_rows * (2 * staging_row_bytes + 2 * scale_bytes + 2 * 4 + 8);
}

}  // namespace cuda
}  // namespace sfmoe
