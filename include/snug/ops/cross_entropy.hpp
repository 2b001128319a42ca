// Softmax cross-entropy's contract, for every backend: N rows of logits
// padded to Vp columns, of which the first V are classes.
#pragma once

#include <cstdint>
#include <string>

#include "snug/core/error.hpp"
#include "snug/ops/sizes.hpp"

namespace snug::ops {

// Throws ShapeError for a negative size, V > Vp, or V == 0 with rows.
inline void check_cross_entropy(const char* op, std::int64_t N, int V, int Vp) {
    check_non_negative(op, {{"N", N}, {"V", V}, {"Vp", Vp}});
    if (V > Vp) {
        throw ShapeError(std::string(op) + ": V = " + std::to_string(V) + " is larger than the padded Vp = " +
                         std::to_string(Vp));
    }
    if (N > 0 && V == 0) throw ShapeError(std::string(op) + ": V = 0 classes for N = " + std::to_string(N) + " rows");
}

}  // namespace snug::ops
