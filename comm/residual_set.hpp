#pragma once
// The error-feedback residuals of one reduction, one per ring label part, of either kind (error_feedback for
// dense dtypes, sparse_error_feedback for sparse).
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "comm/reduction.hpp"

namespace longwave::comm {

template <class Residual>
struct residual_set {
  std::map<uint32_t, std::unique_ptr<Residual>> by_part;

  /// Copies of every part's residual (for a checkpoint).
  residual_vectors copies() const {
    residual_vectors out;
    for (const auto& [part, r] : by_part) out.emplace(part, r->residual());
    return out;
  }
  /// part's residual, or null.
  const std::vector<float>* find(uint32_t part) const {
    const auto it = by_part.find(part);
    return it == by_part.end() ? nullptr : &it->second->residual();
  }
};

}  // namespace longwave::comm
