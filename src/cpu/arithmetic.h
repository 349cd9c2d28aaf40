// One spelling of the arithmetic the CPU references use, for two number types: FP32 through the
// numerics headers (the definition: every operation rounded once, as on the device) and float64
// (the tests' finite-difference checks evaluate the same rules in it).
#pragma once

#include <cmath>

#include "sfmoe/numerics/elementary.h"

namespace sfmoe {
namespace cpu {

template <class Real>
struct Arithmetic;

template <>
struct Arithmetic<float> : numerics::Fp32Arithmetic {
  static float log(float a) { return std::log(a); }  // losses only: not bit-exact across backends
};

template <>
struct Arithmetic<double> {
  using Real = double;
  static double add(double a, double b) { return a + b; }
  static double mul(double a, double b) { return a * b; }
  static double div(double a, double b) { return a / b; }
  static double exp(double a) { return std::exp(a); }
  static double sigmoid(double a) { return 1.0 / (1.0 + std::exp(-a)); }
  static double log(double a) { return std::log(a); }
};

}  // namespace cpu
}  // namespace sfmoe
