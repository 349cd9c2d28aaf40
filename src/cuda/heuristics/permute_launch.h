// Permute's launch choices, from the host's bounds and the buffers' addresses
// (docs/KERNEL_NOTES.md, permute).
#pragma once

#include <stdint.h>

namespace sfmoe {
namespace cuda {

// The rows move by bulk copies (cp.async.bulk through shared memory, the copy kernel placing its
// own token's slots) when the rows and both buffers are 16-byte aligned, which the bulk copy
// requires; else as 16-, 4- or 2-byte vectors through registers after the place kernel. Where both
// run, the bulk form measured 295.7 us against 301.7 (vector copy) and 299.3 (bulk copy after the
// place kernel) on DeepSeek-V3's permute (permute v6).
inline bool permute_copy_by_bulk(const void* tokens, const void* permuted, int64_t row_bytes) {
  return row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(tokens) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(permuted) % 16 == 0;
}

// The vector copy's width: the widest of 16, 4 and 2 bytes that divides the row and both
// buffers' addresses (rows are whole 2-byte elements at least).
inline int permute_vector_bytes(const void* tokens, const void* permuted, int64_t row_bytes) {
  const uint64_t common = static_cast<uint64_t>(row_bytes) | reinterpret_cast<uintptr_t>(tokens) |
                          reinterpret_cast<uintptr_t>(permuted);
  return common % 16 == 0 ? 16 : common % 4 == 0 ? 4 : 2;
}

}  // namespace cuda
}  // namespace sfmoe
