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

}  // namespace cuda
}  // namespace sfmoe
