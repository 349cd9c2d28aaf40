// The activations for one element (gated: one gate and one up value), forward and backward,
// written once over an arithmetic A (A::Real, add, mul, div, sigmoid): numerics::Fp32Arithmetic
// is the definition, run by the CPU reference and the CUDA kernels alike (the operation order
// below fixes the bits); the tests also evaluate it in float64 for finite differences.
// docs/activations.md states the rules in words.
#pragma once

#include "sfmoe/numerics/elementary.h"
#include "src/common/activation_args.h"

namespace sfmoe {

template <class A>
struct ActivationRules {
  using Real = typename A::Real;
  static constexpr Real kSqrt2OverPi = static_cast<Real>(0.7978845608028654);
  static constexpr Real kGeluCubic = static_cast<Real>(0.044715);

  static SFMOE_HD Real silu(Real x) { return A::mul(x, A::sigmoid(x)); }
  // d silu / dx = s (1 + x (1 - s)), s = sigmoid(x) (given: the backward shares it with silu).
  static SFMOE_HD Real silu_grad(Real x, Real s) {
    return A::mul(s, A::add(Real(1), A::mul(x, A::add(Real(1), -s))));
  }
  // The tanh form of GELU, 0.5 x (1 + tanh(y)) with y = sqrt(2/pi) (x + 0.044715 x^3), written
  // as x sigmoid(2 y) (the same function): 1 + tanh(y) = 2 sigmoid(2 y) has no cancellation for
  // negative x, where the tanh spelling loses most of its FP32 digits.
  static SFMOE_HD Real gelu_inner(Real x) {
    return A::mul(kSqrt2OverPi, A::add(x, A::mul(kGeluCubic, A::mul(A::mul(x, x), x))));
  }
  static SFMOE_HD Real gelu_sigmoid(Real x) { return A::sigmoid(A::mul(Real(2), gelu_inner(x))); }
  static SFMOE_HD Real gelu(Real x) { return A::mul(x, gelu_sigmoid(x)); }
  // d/dx x s = s + 2 x s (1 - s) y', s = sigmoid(2 y), y' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
  // Where the sigmoid has saturated (s (1 - s) = 0) the second term is 0; it is skipped, so that
  // x^2 overflowing for |x| > ~1.8e19 cannot turn it into 0 * Inf.
  static SFMOE_HD Real gelu_grad(Real x, Real s) {  // s = gelu_sigmoid(x)
    const Real spread = A::mul(s, A::add(Real(1), -s));
    if (spread == Real(0)) return s;
    const Real slope =
        A::mul(kSqrt2OverPi, A::add(Real(1), A::mul(A::mul(Real(3), kGeluCubic), A::mul(x, x))));
    return A::add(s, A::mul(A::mul(A::mul(Real(2), x), spread), slope));
  }
  static SFMOE_HD Real clamp_gate(Real g, Real limit) { return g > limit ? limit : g; }
  static SFMOE_HD Real clamp_up(Real u, Real limit) {
    return u > limit ? limit : (u < -limit ? -limit : u);
  }

  // a = f(gate, up); non-gated kinds ignore `up`.
  static SFMOE_HD Real forward(const ActivationConfig& c, Real g, Real u) {
    const Real limit = static_cast<Real>(c.limit), alpha = static_cast<Real>(c.alpha);
    switch (c.kind) {
      case ActivationKind::kSwiGLU:
        return A::mul(silu(g), u);
      case ActivationKind::kGeGLU:
        return A::mul(gelu(g), u);
      case ActivationKind::kSiLU:
        return silu(g);
      case ActivationKind::kGeLU:
        return gelu(g);
      case ActivationKind::kSquaredReLU: {
        const Real r = g > Real(0) || g != g ? g : Real(0);  // NaN stays NaN
        return A::mul(r, r);
      }
      case ActivationKind::kClampedSwiGLU: {
        const Real gc = clamp_gate(g, limit), uc = clamp_up(u, limit);
        return A::mul(A::mul(gc, A::sigmoid(A::mul(alpha, gc))), A::add(uc, Real(1)));
      }
    }
    return Real(0);
  }

  // (d gate, d up) from d a. Clamps pass the gradient where the input is inside the limits
  // (bounds included), as torch.clamp does.
  static SFMOE_HD void backward(const ActivationConfig& c, Real g, Real u, Real d, Real* dg,
                                Real* du) {
    const Real limit = static_cast<Real>(c.limit), alpha = static_cast<Real>(c.alpha);
    *du = Real(0);
    switch (c.kind) {
      case ActivationKind::kSwiGLU: {
        const Real s = A::sigmoid(g);
        *dg = A::mul(A::mul(d, u), silu_grad(g, s));
        *du = A::mul(d, A::mul(g, s));
        return;
      }
      case ActivationKind::kGeGLU: {
        const Real s = gelu_sigmoid(g);
        *dg = A::mul(A::mul(d, u), gelu_grad(g, s));
        *du = A::mul(d, A::mul(g, s));
        return;
      }
      case ActivationKind::kSiLU:
        *dg = A::mul(d, silu_grad(g, A::sigmoid(g)));
        return;
      case ActivationKind::kGeLU:
        *dg = A::mul(d, gelu_grad(g, gelu_sigmoid(g)));
        return;
      case ActivationKind::kSquaredReLU:
        *dg = g > Real(0) || g != g ? A::mul(A::mul(Real(2), g), d) : Real(0);
        return;
      case ActivationKind::kClampedSwiGLU: {
        const Real gc = clamp_gate(g, limit), uc = clamp_up(u, limit);
        const Real s = A::sigmoid(A::mul(alpha, gc));
        const Real glu = A::mul(gc, s);
        *du = (u >= -limit && u <= limit) ? A::mul(d, glu) : Real(0);
        // d glu / d gc = s + alpha gc s (1 - s)
        const Real glu_grad = A::add(s, A::mul(A::mul(alpha, gc), A::mul(s, A::add(Real(1), -s))));
        *dg = g <= limit ? A::mul(A::mul(d, A::add(uc, Real(1))), glu_grad) : Real(0);
        return;
      }
    }
    *dg = Real(0);
  }
};

}  // namespace sfmoe
