// Causal self-attention's contract, for every backend: B sequences of T
// tokens, C channels split into NH heads.
#pragma once

#include <string>

#include "snug/core/error.hpp"
#include "snug/ops/sizes.hpp"

namespace snug::ops {

// Throws ShapeError for sizes that make no sense: negative B or T, C or NH
// not positive, or C not divisible by NH.
inline void check_attention(const char* op, int B, int T, int C, int NH) {
    check_non_negative(op, {{"B", B}, {"T", T}, {"C", C}, {"NH", NH}});
    if (NH == 0 || C == 0 || C % NH != 0) {
        throw ShapeError(std::string(op) + ": C = " + std::to_string(C) + " is not a positive multiple of NH = " +
                         std::to_string(NH));
    }
}

}  // namespace snug::ops
