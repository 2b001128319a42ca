// The fused AdamW update's contract, for every backend.
#pragma once

#include <cstdint>
#include <string>

#include "snug/core/error.hpp"
#include "snug/ops/sizes.hpp"

namespace snug::ops {

// Throws ShapeError for n < 0 and ConfigError for step < 1 (steps count from
// 1: the bias corrections divide by 1 - beta^step).
inline void check_adamw(std::int64_t n, int step) {
    check_non_negative("adamw_update", {{"n", n}});
    if (step < 1) throw ConfigError("adamw_update: step = " + std::to_string(step) + ", but steps count from 1");
}

}  // namespace snug::ops
