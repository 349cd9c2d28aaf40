// One of several small copies a backend makes in one go (Backend::copy_spans): the counts an op
// hands out of its scratch, a few hundred bytes each, where a copy call per array costs more than
// the bytes.
#pragma once

#include <stddef.h>

namespace sfmoe {

struct CopySpan {
  void* to;
  const void* from;
  size_t bytes;
};

}  // namespace sfmoe
