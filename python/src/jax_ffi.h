// What the XLA FFI handlers of sfmoe._jax share (python/src/jax_ffi.cpp: the layer;
// python/src/jax_ops_ffi.cpp: the ops): XLA's buffers as sfmoe descriptors, errors as FFI errors,
// and each handler bound twice, for the host (the CPU backend) and for CUDA (the call's stream
// and device; command-buffer compatible).
#pragma once

#include <stdint.h>

#include <memory>
#include <string>
#include <vector>

#include "sfmoe/sfmoe.h"
#include "xla/ffi/api/ffi.h"

namespace sfmoe_jax {

namespace ffi = xla::ffi;

inline ffi::Error fail_with(sfmoe_status status) {
  return ffi::Error(status == SFMOE_ERROR_OUT_OF_MEMORY ? ffi::ErrorCode::kResourceExhausted
                                                        : ffi::ErrorCode::kInvalidArgument,
                    std::string("sfmoe: ") + sfmoe_last_error());
}
inline ffi::Error checked(sfmoe_status status) {
  return status == SFMOE_SUCCESS ? ffi::Error::Success() : fail_with(status);
}
inline ffi::Error refuse(const std::string& why) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "sfmoe: " + why);
}

inline sfmoe_dtype dtype_of(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::BF16:
      return SFMOE_DTYPE_BF16;
    case ffi::DataType::F16:
      return SFMOE_DTYPE_FP16;
    case ffi::DataType::F32:
      return SFMOE_DTYPE_FP32;
    case ffi::DataType::S64:
      return SFMOE_DTYPE_INT64;
    case ffi::DataType::S32:
      return SFMOE_DTYPE_INT32;
    default:  // (bytes: saved states and workspaces)
      return SFMOE_DTYPE_FP8_E4M3;
  }
}

// Where a call runs: the host, or a CUDA device and stream.
struct Where {
  sfmoe_memory memory;
  void* stream;
  int32_t device;
};

// Descriptors of a call's buffers, held until the call returns.
struct Tensors {
  Where where;
  std::vector<std::unique_ptr<sfmoe_tensor>> held;
  std::vector<std::unique_ptr<sfmoe_grouped_tensor>> grouped;

  const sfmoe_tensor* make(void* data, sfmoe_dtype dtype, const std::vector<int64_t>& shape) {
    held.push_back(std::make_unique<sfmoe_tensor>(
        sfmoe_tensor_make(data, dtype, static_cast<int32_t>(shape.size()), shape.data(),
                          where.memory, where.device)));
    return held.back().get();
  }
  const sfmoe_tensor* of(const ffi::AnyBuffer& b) {
    const auto dims = b.dimensions();
    return make(b.untyped_data(), dtype_of(b.element_type()),
                std::vector<int64_t>(dims.begin(), dims.end()));
  }
  // An INT64 array as JAX holds it: INT64 itself (with x64), or int32 pairs in a trailing
  // dimension of 2 (without x64; the same bytes, little-endian).
  const sfmoe_tensor* int64(const ffi::AnyBuffer& b) {
    const auto dims = b.dimensions();
    std::vector<int64_t> shape(dims.begin(), dims.end());
    if (b.element_type() == ffi::DataType::S32 && !shape.empty() && shape.back() == 2) {
      shape.pop_back();
      return make(b.untyped_data(), SFMOE_DTYPE_INT64, shape);
    }
    return make(b.untyped_data(), dtype_of(b.element_type()), shape);
  }
  // The element count of int64(b).
  static int64_t int64_count(const ffi::AnyBuffer& b) {
    const auto dims = b.dimensions();
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return b.element_type() == ffi::DataType::S32 ? n / 2 : n;
  }
  // Unquantized rows [rows, cols] grouped by int64 offsets (or uniform groups of `uniform` rows
  // when offsets is NULL: a weight [G, N, K] as G groups of N rows).
  const sfmoe_grouped_tensor* rows(const ffi::AnyBuffer& data, int64_t groups, int64_t rows,
                                   int64_t cols, const ffi::AnyBuffer* offsets, int64_t uniform = 0,
                                   int64_t row_alignment = 1) {
    auto g = std::make_unique<sfmoe_grouped_tensor>(sfmoe_grouped_tensor_init());
    g->memory = where.memory;
    g->device = where.device;
    g->dtype = dtype_of(data.element_type());
    g->scaling = SFMOE_SCALING_NONE;
    g->num_groups = groups;
    g->row_capacity = rows;
    g->cols = cols;
    g->row_alignment = row_alignment;
    g->uniform_group_rows = uniform;
    g->group_offsets = offsets ? static_cast<int64_t*>(offsets->untyped_data()) : nullptr;
    g->rowwise_data = data.untyped_data();
    grouped.push_back(std::move(g));
    return grouped.back().get();
  }
};

// A handler `F(const Where&, args...)` bound for the host and for CUDA.
template <auto F>
struct OnBoth;
template <class... Args, ffi::Error (*F)(const Where&, Args...)>
struct OnBoth<F> {
  static ffi::Error host(Args... args) { return F(Where{SFMOE_MEMORY_HOST, nullptr, 0}, args...); }
  static ffi::Error cuda(void* stream, int32_t device, Args... args) {
    return F(Where{SFMOE_MEMORY_CUDA, stream, device}, args...);
  }
};

}  // namespace sfmoe_jax

// Defines <Name>Host and <Name>Cuda, the handler `fn` with the binding `...` (the arguments,
// attributes and results after Bind()), the CUDA one with its stream and device first.
#define SFMOE_JAX_HANDLERS(Name, fn, ...)                                          \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(Name##Host, ::sfmoe_jax::OnBoth<fn>::host,         \
                                ::xla::ffi::Ffi::Bind() __VA_ARGS__);              \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(Name##Cuda, ::sfmoe_jax::OnBoth<fn>::cuda,         \
                                ::xla::ffi::Ffi::Bind()                            \
                                    .Ctx<::xla::ffi::PlatformStream<void*>>()      \
                                    .Ctx<::xla::ffi::DeviceOrdinal>() __VA_ARGS__, \
                                {::xla::ffi::Traits::kCmdBufferCompatible})
