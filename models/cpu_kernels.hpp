#pragma once
// Which CPU kernels this process's LibTorch uses. Float results differ between kernel sets (AVX2 and AVX-512
// sum in different orders), so runs are bit-for-bit comparable only on the same set.
#include <string>

namespace longwave::models {

/// "AMD EPYC, LibTorch 1.13, ATen AVX2, OpenBLAS Haswell": the CPU's model name, ATen's dispatch level
/// (ATEN_CPU_CAPABILITY caps it) and OpenBLAS's core (OPENBLAS_CORETYPE sets it); "unknown" for a part this
/// process cannot tell. The CPU is named because the same kernels may block their sums by its cache sizes.
std::string cpu_kernels();

}  // namespace longwave::models
