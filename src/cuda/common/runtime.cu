// CUDA runtime queries and status-word storage for the CUDA backend.
#include <stdio.h>
#include <string.h>

#include "src/cuda/backend.h"
#include "src/cuda/common/cuda_check.h"

namespace sfmoe {
namespace cuda {
namespace {

// A trivial kernel: whether it has an image for the current device tells whether this build's
// machine code runs here.
__global__ void probe_kernel() {}

constexpr int kMaxDevices = 64;
int g_multiprocessors[kMaxDevices] = {0};

}  // namespace

int compiled_cuda_version() { return CUDART_VERSION; }

int device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky "no device" error
      return 0;
    }
    return n;
  }();
  return count;
}

int multiprocessor_count() {
  int device = 0;
  (void)cudaGetDevice(&device);
  if (device < 0 || device >= kMaxDevices) device = 0;
  if (g_multiprocessors[device] == 0) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      sms = 1;
    }
    g_multiprocessors[device] = sms;
  }
  return g_multiprocessors[device];
}

int grid_for(int64_t work_items, int threads_per_block) {
  const int64_t blocks = (work_items + threads_per_block - 1) / threads_per_block;
  const int64_t max_blocks = static_cast<int64_t>(multiprocessor_count()) * 8;
  if (blocks < 1) return 1;
  return static_cast<int>(blocks < max_blocks ? blocks : max_blocks);
}

int64_t resident_wave(const void* kernel, int threads_per_block, size_t dynamic_shared) {
  int blocks_per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, threads_per_block,
                                                    dynamic_shared) != cudaSuccess) {
    (void)cudaGetLastError();  // a launch of this kernel reports the problem
    blocks_per_sm = 1;
  }
  return static_cast<int64_t>(multiprocessor_count()) * (blocks_per_sm > 0 ? blocks_per_sm : 1);
}

PointerKind classify_pointer(const void* pointer, int32_t* device) {
  if (device_count() == 0) return PointerKind::kUnknown;
  cudaPointerAttributes attributes;
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    (void)cudaGetLastError();
    return PointerKind::kUnknown;
  }
  *device = attributes.device;
  switch (attributes.type) {
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged:
      return PointerKind::kDeviceMemory;
    case cudaMemoryTypeUnregistered:
      return PointerKind::kHostMemory;
    default:
      return PointerKind::kUnknown;  // pinned host memory is usable by both sides
  }
}

sfmoe_status fill_device_info(sfmoe_device_info* info) {
  (void)cudaRuntimeGetVersion(&info->runtime_version);
  (void)cudaDriverGetVersion(&info->driver_version);
  info->device_count = device_count();
  if (info->device_count == 0) return SFMOE_SUCCESS;
  cudaDeviceProp prop;
  SFMOE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  snprintf(info->name, sizeof(info->name), "%s", prop.name);
  info->compute_major = prop.major;
  info->compute_minor = prop.minor;
  info->multiprocessors = prop.multiProcessorCount;
  info->global_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info->l2_cache_bytes = prop.l2CacheSize;
  cudaFuncAttributes attributes;
  const cudaError_t probe = cudaFuncGetAttributes(&attributes, probe_kernel);
  info->kernels_supported = probe == cudaSuccess ? 1 : 0;
  if (probe != cudaSuccess) (void)cudaGetLastError();
  return SFMOE_SUCCESS;
}

sfmoe_status status_word_allocate(int32_t device, sfmoe_fault_report** device_word,
                                  sfmoe_fault_report** host_mirror) {
  int previous = 0;
  SFMOE_CUDA_RETURN_IF_ERROR(cudaGetDevice(&previous));
  SFMOE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  sfmoe_fault_report initial;
  initial.flags = 0;
  initial.count = 0;
  initial.first_group = -1;
  initial.first_value = 0;
  cudaError_t error = cudaMalloc(device_word, sizeof(sfmoe_fault_report));
  if (error == cudaSuccess) error = cudaMallocHost(host_mirror, sizeof(sfmoe_fault_report));
  // sync-ok: creation happens outside the step, and the word must start cleared.
  if (error == cudaSuccess) {
    error = cudaMemcpy(*device_word, &initial, sizeof(initial), cudaMemcpyHostToDevice);
  }
  (void)cudaSetDevice(previous);
  if (error != cudaSuccess) {
    if (*device_word) cudaFree(*device_word);
    if (*host_mirror) cudaFreeHost(*host_mirror);
    *device_word = nullptr;
    *host_mirror = nullptr;
    return cuda_fail("allocating the status word", error);
  }
  return SFMOE_SUCCESS;
}

void status_word_free(int32_t device, sfmoe_fault_report* device_word,
                      sfmoe_fault_report* host_mirror) {
  int previous = 0;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(device);
  (void)cudaFree(device_word);
  (void)cudaFreeHost(host_mirror);
  (void)cudaSetDevice(previous);
}

namespace {
__global__ void reset_status_word_kernel(sfmoe_fault_report* word) {
  word->flags = 0;
  word->count = 0;
  word->first_group = -1;
  word->first_value = 0;
}
}  // namespace

sfmoe_status status_word_reset(sfmoe_fault_report* device_word, void* stream) {
  reset_status_word_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(device_word);
  return check_launch("reset_status_word_kernel");
}

sfmoe_status status_word_snapshot(const sfmoe_fault_report* device_word,
                                  sfmoe_fault_report* host_mirror, void* stream) {
  // sync-ok: an enqueued copy into pinned memory; capturable, and nothing waits for it here.
  const cudaError_t error =
      cudaMemcpyAsync(host_mirror, device_word, sizeof(sfmoe_fault_report),
                      cudaMemcpyDeviceToHost,  // sync-ok: asynchronous, into pinned memory
                      static_cast<cudaStream_t>(stream));
  if (error != cudaSuccess) return cuda_fail("cudaMemcpyAsync", error);
  return SFMOE_SUCCESS;
}

sfmoe_status copy_device_async(void* to, const void* from, size_t bytes, void* stream) {
  const cudaError_t error =
      cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream));
  return error == cudaSuccess ? SFMOE_SUCCESS : cuda_fail("cudaMemcpyAsync", error);
}

namespace {

constexpr size_t kSpansPerLaunch = 32;
constexpr size_t kLargestSpan = 64 << 10;  // (larger ones: a copy of their own)
struct Spans {
  CopySpan span[kSpansPerLaunch];
};

// A block per span, 8-byte words when both ends and the size allow (always with `plus`: int64
// counts, 8-byte aligned).
__global__ void copy_spans_kernel(Spans spans) {
  const CopySpan& c = spans.span[blockIdx.x];
  const uintptr_t ends = reinterpret_cast<uintptr_t>(c.to) | reinterpret_cast<uintptr_t>(c.from);
  if (c.plus != nullptr) {
    const int64_t* from = static_cast<const int64_t*>(c.from);
    int64_t* to = static_cast<int64_t*>(c.to);
    for (size_t i = threadIdx.x; i < c.bytes / 8; i += blockDim.x) to[i] = from[i] + c.plus[i];
  } else if (ends % 8 == 0 && c.bytes % 8 == 0) {
    const uint64_t* from = static_cast<const uint64_t*>(c.from);
    uint64_t* to = static_cast<uint64_t*>(c.to);
    for (size_t i = threadIdx.x; i < c.bytes / 8; i += blockDim.x) to[i] = from[i];
  } else {
    const uint8_t* from = static_cast<const uint8_t*>(c.from);
    uint8_t* to = static_cast<uint8_t*>(c.to);
    for (size_t i = threadIdx.x; i < c.bytes; i += blockDim.x) to[i] = from[i];
  }
}

}  // namespace

sfmoe_status copy_spans_async(const CopySpan* spans, size_t count, void* stream) {
  Spans batch{};
  size_t n = 0;
  auto flush = [&]() -> sfmoe_status {
    if (n == 0) return SFMOE_SUCCESS;
    copy_spans_kernel<<<static_cast<unsigned>(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        batch);
    n = 0;
    return check_launch("copy_spans_kernel");
  };
  for (size_t i = 0; i < count; ++i) {
    if (spans[i].bytes == 0) continue;
    if (spans[i].bytes > kLargestSpan && spans[i].plus == nullptr) {
      SFMOE_RETURN_IF_ERROR(copy_device_async(spans[i].to, spans[i].from, spans[i].bytes, stream));
      continue;
    }
    batch.span[n++] = spans[i];
    if (n == kSpansPerLaunch) SFMOE_RETURN_IF_ERROR(flush());
  }
  return flush();
}

}  // namespace cuda
}  // namespace sfmoe
