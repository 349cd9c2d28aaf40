// Slow, independent references for the numerics, written from the format definitions with
// double arithmetic and table search, sharing no code with include/sfmoe/numerics/ beyond
// bit-casting. The fast functions must agree with these bit for bit.
#pragma once

#include <stdint.h>

#include "tests/cpp/numerics_cases.h"

namespace sfmoe {
namespace testing {

// Reference result of `fn` on (a, b), or false if `fn` has no independent reference
// (Philox is checked against published answer vectors instead).
bool reference_numerics(NumericsFn fn, uint32_t a, uint32_t b, uint32_t* result);

// Both results represent the same value: equal bits, or both NaN where the result is an FP32.
bool same_result(NumericsFn fn, uint32_t x, uint32_t y);

}  // namespace testing
}  // namespace sfmoe
