// One of several small copies a backend makes in one go (Backend::copy_spans): the counts an op
// hands out of its scratch, a few hundred bytes each, where a copy call per array costs more than
// the bytes.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace sfmoe {

struct CopySpan {
  void* to;
  const void* from;
  size_t bytes;
  // Or NULL: int64 words added to `from`'s (to[i] = from[i] + plus[i]; bytes a multiple of 8):
  // counts summed over rounds (an expert-parallel SPILL's two rounds of kept rows).
  const int64_t* plus = nullptr;
};

}  // namespace sfmoe
