// The fused AdamW update's contract, for every backend: its checks, and the
// random stream that rounds the state it keeps in 16 bits.
#pragma once

#include <cstdint>
#include <string>

#include "snug/core/error.hpp"
#include "snug/ops/sizes.hpp"

namespace snug::ops {

// Where an update's stochastic rounding takes its random bits (bf16 moments,
// bf16 weights without a master copy): element i of a call at optimizer step
// s reads the Philox block random_block(seed, s, first_index + i) (core/rng.hpp)
// — word 0 rounds the first moment, word 1 the second, word 2 the weight. So
// the bits depend on the parameter's index in the whole model and the step
// only: the same on every backend, thread count and resume.
struct AdamWRounding {
    std::uint64_t seed = 0;
    std::int64_t first_index = 0;  // the model-wide index of element 0 of this call
};

// Throws ShapeError for n < 0 and ConfigError for step < 1 (steps count from
// 1: the bias corrections divide by 1 - beta^step).
inline void check_adamw(std::int64_t n, int step) {
    check_non_negative("adamw_update", {{"n", n}});
    if (step < 1) throw ConfigError("adamw_update: step = " + std::to_string(step) + ", but steps count from 1");
}

}  // namespace snug::ops
