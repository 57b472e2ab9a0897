// One row through a row-major matrix (csrc/Gemv.cpp): linear at batch 1 on the
// device (csrc/Linear.cpp).
#pragma once

#include <cstdint>

namespace torch_neuronx {

// y[j] = sum over i of weight[j * k + i] * x[i], plus bias[j] when bias is not
// null, for j < n. The same bits on every CPU and at every thread count.
void gemv(const float* weight, const float* x, const float* bias, float* y, int64_t n, int64_t k);
// Whether gemv splits its rows across the intra-op threads (more than one, a
// weight above about 256 KiB).
bool gemvSplits(int64_t n, int64_t k);
// gemv on the calling thread alone (the concatenation queue's device thread):
// the same bits.
void gemvOnThisThread(const float* weight, const float* x, const float* bias, float* y, int64_t n, int64_t k);

} // namespace torch_neuronx
