#pragma once
// Which CPU kernels this process's LibTorch uses. Float results differ between kernel sets (AVX2 and AVX-512
// sum in different orders), so runs are bit-for-bit comparable only on the same set.
#include <string>

namespace longwave::models {

/// "LibTorch 1.13, ATen AVX2, OpenBLAS Haswell": ATen's dispatch level (ATEN_CPU_CAPABILITY caps it) and
/// OpenBLAS's core (OPENBLAS_CORETYPE sets it); "unknown" for a part this process cannot tell.
std::string cpu_kernels();

}  // namespace longwave::models
