// The device's own float32 transcendental functions (exp, tanh, sigmoid, SiLU),
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

} // namespace floatmath
} // namespace torch_neuronx
