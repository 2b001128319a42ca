// The linear layer's contract, for every backend: out (N, OC) = inp (N, C)
// weightᵀ (+ bias), and its backward. Sizes are non-negative; a pointer that
// would be read or written must not be null (bias, dbias and dinp may be:
// no bias, no bias gradient, no input gradient).
#pragma once

#include <cstdint>
#include <string>

#include "snug/core/error.hpp"
#include "snug/ops/sizes.hpp"

namespace snug::ops {

[[noreturn]] inline void throw_null_linear_pointer(const char* op, const char* name, std::int64_t N, int C, int OC) {
    throw Error(std::string(op) + ": " + name + " is null (N = " + std::to_string(N) + ", C = " + std::to_string(C) +
                ", OC = " + std::to_string(OC) + ")");
}

// Throws snug::Error naming the pointer and the sizes when `p` is null. (The
// throw stays out of line: inlined, it confuses GCC's array-bounds analysis
// of the callers' loops.)
inline void require_linear_pointer(const char* op, const char* name, const void* p, std::int64_t N, int C, int OC) {
    if (p == nullptr) [[unlikely]]
        throw_null_linear_pointer(op, name, N, C, OC);
}

inline void check_linear_forward(const char* op, const void* out, const void* inp, const void* weight, std::int64_t N,
                                 int C, int OC) {
    check_non_negative(op, {{"N", N}, {"C", C}, {"OC", OC}});
    if (N == 0 || OC == 0) return;
    require_linear_pointer(op, "out", out, N, C, OC);
    if (C > 0) {
        require_linear_pointer(op, "inp", inp, N, C, OC);
        require_linear_pointer(op, "weight", weight, N, C, OC);
    }
}

inline void check_linear_backward(const char* op, const void* dinp, const void* dweight, const void* dout,
                                  const void* inp, const void* weight, std::int64_t N, int C, int OC) {
    check_non_negative(op, {{"N", N}, {"C", C}, {"OC", OC}});
    if (N > 0 && OC > 0) require_linear_pointer(op, "dout", dout, N, C, OC);
    if (C > 0 && OC > 0) require_linear_pointer(op, "dweight", dweight, N, C, OC);
    if (N > 0 && C > 0 && OC > 0) {
        require_linear_pointer(op, "inp", inp, N, C, OC);
        if (dinp != nullptr) require_linear_pointer(op, "weight", weight, N, C, OC);
    }
}

}  // namespace snug::ops
