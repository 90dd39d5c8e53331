#pragma once
// Checks over model-sized tensors that allocate one chunk, not a model-sized temporary.
#include <ATen/core/Tensor.h>

namespace longwave::runtime {

/// True when every value of t (undefined: none) is finite. at::isfinite(t).all() would allocate |t| values
/// of abs() and three boolean masks: 1.75 fp32 copies of a model-sized t.
bool all_finite(const at::Tensor& t);

}  // namespace longwave::runtime
