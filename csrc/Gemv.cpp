// One row times a row-major weight, y = W x + b: what linear is at batch 1
// (a decoding step, a single sample), on the device.
//
// PyTorch's CPU linear hands it to MKL's sgemm with one row, which streams the
// weight at about half the rate of a plain vectorized loop on an AMD EPYC: a
// Linear(256, 1024) at batch 1 took 25 to 32 us there against 15 to 17 us
// here and 16 us in OpenBLAS's sgemv (one thread each; docs/eager-and-fallback.md).
//
// The sum is written so that its order is fixed: each row keeps 8 partial sums
// (lane l adds the products of the columns i = l mod 8, in order), added
// pairwise ((0+1)+(2+3))+((4+5)+(6+7)), then the columns past the last multiple
// of 8 in order, then the bias. Each row is computed alone, so blocking rows,
// splitting them over threads and the CPU's vector width (CpuLoops.h's two
// builds: 8 lanes in one AVX register or in two SSE registers) change nothing:
// the same bits everywhere. The order differs from MKL's (whose own depends on
// the CPU); against float64 it is at least as close (tests/test_linear_row.py).
#include "Gemv.h"

#include "CpuLoops.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

namespace torch_neuronx {
namespace {

// 8 float32 lanes in one 256-bit vector (the AVX2 build).
struct Lanes8 {
  typedef float v8 __attribute__((vector_size(32)));
  v8 v;
  static NEURON_INLINE Lanes8 zero() {
    return Lanes8{v8{}};
  }
  static NEURON_INLINE Lanes8 load(const float* p) {
    Lanes8 r;
    std::memcpy(&r.v, p, sizeof(r.v));
    return r;
  }
  NEURON_INLINE void addProduct(const Lanes8& a, const Lanes8& b) {
    v += a.v * b.v;
  }
  NEURON_INLINE float lane(int i) const {
    return v[i];
  }
};

// The same 8 lanes in two 128-bit vectors (any x86-64 CPU: a 256-bit vector
// type there is kept in memory between operations).
struct Lanes4x2 {
  typedef float v4 __attribute__((vector_size(16)));
  v4 lo, hi;
  static NEURON_INLINE Lanes4x2 zero() {
    return Lanes4x2{v4{}, v4{}};
  }
  static NEURON_INLINE Lanes4x2 load(const float* p) {
    Lanes4x2 r;
    std::memcpy(&r.lo, p, sizeof(r.lo));
    std::memcpy(&r.hi, p + 4, sizeof(r.hi));
    return r;
  }
  NEURON_INLINE void addProduct(const Lanes4x2& a, const Lanes4x2& b) {
    lo += a.lo * b.lo;
    hi += a.hi * b.hi;
  }
  NEURON_INLINE float lane(int i) const {
    return i < 4 ? lo[i] : hi[i - 4];
  }
};

// Rows [0, R) of the block starting at `w` (R rows share each load of x).
template <class Lanes, int R>
NEURON_INLINE void rows(const float* w, const float* x, const float* bias, float* y, int64_t k) {
  const int64_t whole = k - k % 8;
  Lanes acc[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = Lanes::zero();
  }
  for (int64_t i = 0; i < whole; i += 8) {
    const Lanes xs = Lanes::load(x + i);
    for (int r = 0; r < R; ++r) {
      acc[r].addProduct(Lanes::load(w + r * k + i), xs);
    }
  }
  for (int r = 0; r < R; ++r) {
    const Lanes& a = acc[r];
    float sum = ((a.lane(0) + a.lane(1)) + (a.lane(2) + a.lane(3))) + ((a.lane(4) + a.lane(5)) + (a.lane(6) + a.lane(7)));
    for (int64_t i = whole; i < k; ++i) {
      sum += w[r * k + i] * x[i];
    }
    y[r] = bias != nullptr ? sum + bias[r] : sum;
  }
}

template <class Lanes>
NEURON_INLINE void rowRange(const float* w, const float* x, const float* bias, float* y, int64_t begin, int64_t end,
                            int64_t k) {
  int64_t j = begin;
  for (; j + 4 <= end; j += 4) {
    rows<Lanes, 4>(w + j * k, x, bias != nullptr ? bias + j : nullptr, y + j, k);
  }
  for (; j < end; ++j) {
    rows<Lanes, 1>(w + j * k, x, bias != nullptr ? bias + j : nullptr, y + j, k);
  }
}

NEURON_VECTORIZED void rowRangeAnyCpu(const float* w, const float* x, const float* bias, float* y, int64_t begin,
                                      int64_t end, int64_t k) {
  rowRange<Lanes4x2>(w, x, bias, y, begin, end, k);
}

#ifdef NEURON_X86_FMA
NEURON_VECTORIZED NEURON_AVX2_FMA void rowRangeAvx2Fma(const float* w, const float* x, const float* bias, float* y,
                                                       int64_t begin, int64_t end, int64_t k) {
  rowRange<Lanes8>(w, x, bias, y, begin, end, k);
}
#endif

// Rows per task when the weight is split over threads: about 256 KiB of it
// each (a smaller split costs more in waking threads than it saves).
constexpr int64_t kBytesPerTask = 256 * 1024;

// Rows per task.
int64_t grainRows(int64_t k) {
  return std::max<int64_t>(4, kBytesPerTask / (std::max<int64_t>(k, 1) * sizeof(float)));
}

void rowRangeOnThisThread(const float* weight, const float* x, const float* bias, float* y, int64_t begin,
                          int64_t end, int64_t k) {
#ifdef NEURON_X86_FMA
  if (avx2FmaLoops()) {
    rowRangeAvx2Fma(weight, x, bias, y, begin, end, k);
    return;
  }
#endif
  rowRangeAnyCpu(weight, x, bias, y, begin, end, k);
}

} // namespace

void gemv(const float* weight, const float* x, const float* bias, float* y, int64_t n, int64_t k) {
  at::parallel_for(0, n, grainRows(k), [&](int64_t begin, int64_t end) {
    rowRangeOnThisThread(weight, x, bias, y, begin, end, k);
  });
}

bool gemvSplits(int64_t n, int64_t k) {
  return n > grainRows(k) && at::get_num_threads() > 1 && !at::in_parallel_region();
}

void gemvOnThisThread(const float* weight, const float* x, const float* bias, float* y, int64_t n, int64_t k) {
  rowRangeOnThisThread(weight, x, bias, y, 0, n, k);
}

} // namespace torch_neuronx
