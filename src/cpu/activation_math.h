// The activation rules (src/common/activation_rules.h) in the CPU reference's arithmetics: FP32
// (the definition) and float64 (the tests' finite differences).
#pragma once

#include "src/common/activation_rules.h"
#include "src/cpu/arithmetic.h"

namespace sfmoe {
namespace cpu {

template <class Real>
using Activation = ActivationRules<Arithmetic<Real>>;

}  // namespace cpu
}  // namespace sfmoe
