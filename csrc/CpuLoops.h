// The device's own compute loops (the concatenation queue's, csrc/Concatenation.cpp;
// linear's one-row product, csrc/Gemv.cpp): written once, built twice, and the
// build is chosen when the extension loads: one for any CPU of the build's
// architecture, one for x86-64 CPUs with AVX2 and FMA. Both builds give the
// same bits, so results do not depend on the CPU: no multiply-add is contracted
// into one fused instruction (fp-contract=off), where the FMA build would.
#pragma once

#include <atomic>

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's -O2 does not vectorize a loop that needs a run-time check that its
// output and inputs do not overlap (in-place calls do overlap): ask for -O3.
#define NEURON_VECTORIZED __attribute__((optimize("O3", "fp-contract=off")))
#else
#pragma STDC FP_CONTRACT OFF
#define NEURON_VECTORIZED
#endif
#define NEURON_INLINE inline __attribute__((always_inline))
#if defined(__x86_64__) && defined(__GNUC__)
#define NEURON_X86_FMA 1
#define NEURON_AVX2_FMA __attribute__((target("avx2,fma")))
#endif

namespace torch_neuronx {

// Tests: the loops built for any CPU, even where the AVX2+FMA ones could run.
inline std::atomic<bool> gAnyCpuLoops{false};

// Whether the AVX2+FMA build of the loops runs.
inline bool avx2FmaLoops() noexcept {
#ifdef NEURON_X86_FMA
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has && !gAnyCpuLoops.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

} // namespace torch_neuronx
