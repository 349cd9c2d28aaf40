// The elementwise scaled cast as the backends take it (sfmoe_cast, include/sfmoe/cast.h).
#pragma once

#include <stdint.h>

#include "sfmoe/sfmoe.h"

namespace sfmoe {

struct CastArgs {
  const void* input;
  sfmoe_dtype input_dtype;
  void* output;
  sfmoe_dtype output_dtype;
  int64_t count;
  float scale;
  const float* scale_device;  // one float beside the data replacing `scale`, or NULL
};

}  // namespace sfmoe
