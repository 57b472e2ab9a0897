// The device's own float32 transcendental functions (exp, tanh, sigmoid, SiLU,
// erf and GELU),
// for the concatenation queue's loops (csrc/Concatenation.cpp).
//
// Why not std::exp or PyTorch's: the C library's expf is a call per element
// that no compiler vectorizes, and PyTorch's vectorized exp (SLEEF) is chosen
// by the CPU's instruction set (AVX2, AVX-512, or the scalar tail), so its bits
// depend on the machine. These are plain float arithmetic with explicit
// std::fma and branch-free selects: GCC vectorizes them in the queue's loops,
// and the loops built for any CPU and for AVX2+FMA (CpuLoops.h) give the same
// bits. Accuracy, measured over every float32 input against the
// double-precision result (tests/test_concatenation.py samples it again):
// exp within 1.013 ulp, tanh within 1.330 ulp; sigmoid and SiLU are PyTorch's
// formulas, 1 / (1 + exp(-x)) and x / (1 + exp(-x)), on this exp.
//
// The method is the textbook one (Cody and Waite's range reduction, Cephes'
// minimax polynomials): e^x = 2^n * e^r with n = round(x / ln 2) and
// |r| <= ln(2) / 2, ln 2 split in two so that r is exact; tanh(x) for
// |x| < 0.625 as an odd polynomial, beyond as 1 - 2 / (e^(2|x|) + 1).
#pragma once

#include "CpuLoops.h"  // NEURON_INLINE

#include <cmath>
#include <cstdint>
#include <cstring>

namespace torch_neuronx {
namespace floatmath {

NEURON_INLINE uint32_t bitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

NEURON_INLINE float fromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// `condition ? a : b` on bits: GCC would turn a ternary into a branch (jump
// threading, or computing an operand only where it is chosen), and a loop with
// a branch is not vectorized.
NEURON_INLINE uint32_t selectBits(bool condition, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return (a & mask) | (b & ~mask);
}

NEURON_INLINE float select(bool condition, float a, float b) {
  return fromBits(selectBits(condition, bitsOf(a), bitsOf(b)));
}

NEURON_INLINE float exp(float x) {
  // Beyond [-104, 89] the result is 0 or infinity either way; clamping keeps n
  // small. A NaN passes the clamps and propagates through the arithmetic.
  float clamped = select(x > 89.0f, 89.0f, x);
  clamped = select(clamped < -104.0f, -104.0f, clamped);
  // n = round(x * log2(e)): adding 1.5 * 2^23 rounds to an integer, which the
  // sum's low mantissa bits then hold (no float-to-int conversion, which a NaN
  // would make undefined).
  constexpr float kRound = 12582912.0f;
  const float shifted = clamped * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  const auto exponent = static_cast<int32_t>(bitsOf(shifted) - bitsOf(kRound));
  float r = std::fma(n, -0.693145751953125f, clamped);  // ln 2's leading bits: n * them is exact
  r = std::fma(n, -1.428606765330187045e-06f, r);       // the rest of ln 2
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const float er = std::fma(p, r * r, r) + 1.0f;
  // 2^n in two factors (n is in [-150, 128], each half a normal float's
  // exponent): a subnormal result is rounded once, by the second product.
  const int32_t half = exponent >> 1;
  const float first = fromBits(static_cast<uint32_t>(half + 127) << 23);
  const float second = fromBits(static_cast<uint32_t>(exponent - half + 127) << 23);
  return er * first * second;
}

NEURON_INLINE float tanh(float x) {
  const float ax = std::fabs(x);
  const float z = ax * ax;
  float p = -5.70498872745e-3f;
  p = std::fma(p, z, 2.06390887954e-2f);
  p = std::fma(p, z, -5.37397155531e-2f);
  p = std::fma(p, z, 1.33314422036e-1f);
  p = std::fma(p, z, -3.33332819422e-1f);
  const float small = std::fma(ax * z, p, ax);
  const float large = 1.0f - 2.0f / (exp(ax + ax) + 1.0f);  // 1 once e^(2|x|) is infinite
  return std::copysign(select(ax < 0.625f, small, large), x);  // tanh(-0) = -0; a NaN stays NaN
}

// PyTorch's CPU formulas (aten/src/ATen/native/cpu: sigmoid, silu, silu_backward).
NEURON_INLINE float sigmoid(float x) {
  return 1.0f / (1.0f + exp(-x));
}

NEURON_INLINE float silu(float x) {
  return x / (1.0f + exp(-x));
}

NEURON_INLINE float siluBackward(float grad, float x) {
  const float s = sigmoid(x);
  return grad * s * (1.0f + x * (1.0f - s));
}

// erf by Abramowitz and Stegun's formula 7.1.26, 1 - t * P(t) * e^(-x^2) with
// t = 1 / (1 + 0.3275911 |x|) (absolute error at most 1.5e-7, published), the
// approximation PyTorch's vectorized float erf uses, so its GELU's; the sign of x.
NEURON_INLINE float erf(float x) {
  const float ax = std::fabs(x);
  const float t = 1.0f / std::fma(0.3275911f, ax, 1.0f);
  float p = 1.061405429f;
  p = std::fma(p, t, -1.453152027f);
  p = std::fma(p, t, 1.421413741f);
  p = std::fma(p, t, -0.284496736f);
  p = std::fma(p, t, 0.254829592f);
  const float r = 1.0f - p * t * exp(-(ax * ax));
  return std::copysign(r, x);  // erf(-0) = -0; a NaN stays NaN
}

// GELU and its gradient in PyTorch's CPU formulas (aten/src/ATen/native/cpu
// Activation.cpp): exact, x / 2 * (1 + erf(x / sqrt 2)), and the tanh form,
// x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))).
constexpr float kSqrtHalf = 0.707106781186547524f;          // 1 / sqrt 2
constexpr float kGeluPdf = 0.398942280401432678f;           // 1 / sqrt(2 pi)
constexpr float kGeluTanhBeta = 0.797884560802865356f;      // sqrt(2 / pi)
constexpr float kGeluTanhKappa = 0.044715f;

NEURON_INLINE float gelu(float x) {
  return x * 0.5f * (1.0f + erf(x * kSqrtHalf));
}

NEURON_INLINE float geluTanh(float x) {
  const float inner = kGeluTanhBeta * (x + kGeluTanhKappa * (x * x * x));
  return 0.5f * x * (1.0f + tanh(inner));
}

NEURON_INLINE float geluBackward(float grad, float x) {
  const float cdf = 0.5f * (1.0f + erf(x * kSqrtHalf));
  const float pdf = exp(-0.5f * x * x) * kGeluPdf;
  return grad * (cdf + x * pdf);
}

NEURON_INLINE float geluTanhBackward(float grad, float x) {
  const float square = x * x;
  const float inner = kGeluTanhBeta * (x + kGeluTanhKappa * (square * x));
  const float t = tanh(inner);
  const float left = 0.5f * x;
  const float right = 1.0f + t;
  const float left_derivative = 0.5f * right;
  const float right_derivative = left * (1.0f - t * t) * kGeluTanhBeta * (1.0f + 3.0f * kGeluTanhKappa * square);
  return grad * (left_derivative + right_derivative);
}

} // namespace floatmath
} // namespace torch_neuronx
