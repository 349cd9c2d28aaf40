// The op handlers of sfmoe._jax (python/src/jax_ops_ffi.cpp), listed for the module's
// registration table (python/src/jax_ffi.cpp).
#pragma once

#include <vector>

namespace sfmoe_jax {

struct HandlerPair {
  const char* name;  // the FFI target's name
  void* host;        // XLA_FFI_Handler*, for the CPU platform
  void* cuda;        // for CUDA
};

std::vector<HandlerPair> op_handlers();

}  // namespace sfmoe_jax
