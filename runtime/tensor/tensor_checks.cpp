// all_finite, a chunk at a time.
#include "runtime/tensor/tensor_checks.hpp"

#include <ATen/ATen.h>

#include <algorithm>

namespace longwave::runtime {

bool all_finite(const at::Tensor& t) {
  if (!t.defined()) return true;
  constexpr int64_t chunk = int64_t{1} << 20;
  const auto flat = t.reshape({-1});
  const int64_t n = flat.numel();
  for (int64_t off = 0; off < n; off += chunk)
    if (!at::isfinite(flat.narrow(0, off, std::min(chunk, n - off))).all().item<bool>()) return false;
  return true;
}

}  // namespace longwave::runtime
