// The status word object behind the opaque sfmoe_status_word handle.
#pragma once

#include "sfmoe/sfmoe.h"

struct sfmoe_status_word {
  sfmoe_memory memory;
  int32_t device;
  sfmoe_fault_report* word;    // where kernels record faults (device memory for CUDA)
  sfmoe_fault_report* mirror;  // what read() returns (pinned host memory for CUDA)
};
