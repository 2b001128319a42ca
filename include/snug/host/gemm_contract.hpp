// The host GEMM's contract, shared by its two implementations (gemm.hpp's
// OpenBLAS binding, gemm_portable.hpp's own kernel): how an operand is read
// (Op), the element types, and the argument checks and the cases that need no
// product, written once.
#pragma once

#include <concepts>
#include <cstdint>
#include <source_location>
#include <string>

#include "snug/core/dtype.hpp"
#include "snug/core/error.hpp"
#include "snug/core/half.hpp"

namespace snug::host {

// How a GEMM reads an operand: as stored (N) or transposed (T).
enum class Op : bool { N, T };

// C is float, or the inputs' own 16-bit type (computed in fp32, rounded to
// nearest even once at the end).
template <class TC, class T>
concept GemmOutput = FloatStorage<T> && (std::same_as<TC, float> || std::same_as<TC, T>);

namespace detail {

using gemm_index = std::int64_t;

// ---- argument checks and the cases that need no product ------------------------

inline std::string gemm_dims(gemm_index M, gemm_index N, gemm_index K) {
    return "(M = " + std::to_string(M) + ", N = " + std::to_string(N) + ", K = " + std::to_string(K) + ")";
}

// Throws ShapeError for a negative size or a leading dimension shorter than a
// stored row, and snug::Error for a null pointer that would be read.
inline void check_gemm(const char* name, Op op_a, Op op_b, gemm_index M, gemm_index N, gemm_index K,
                       const void* A, gemm_index lda, const void* B, gemm_index ldb, const void* C,
                       gemm_index ldc, const std::source_location& loc) {
    const std::string prefix = snug::detail::where(loc) + name + ": ";
    if (M < 0 || N < 0 || K < 0) {
        throw ShapeError(prefix + "negative size " + gemm_dims(M, N, K));
    }
    auto check_ld = [&](const char* ld_name, gemm_index ld, const char* matrix, bool transposed,
                        const char* rows_name, gemm_index rows, const char* cols_name, gemm_index cols) {
        if (ld < cols) {
            throw ShapeError(prefix + ld_name + " = " + std::to_string(ld) + " is smaller than a row of " +
                             matrix + " (" + std::to_string(cols) + " elements: " + matrix +
                             (transposed ? " is stored transposed, (" : " is stored (") + rows_name + ", " +
                             cols_name + ") = (" + std::to_string(rows) + ", " + std::to_string(cols) +
                             "))");
        }
    };
    if (op_a == Op::N) {
        check_ld("lda", lda, "A", false, "M", M, "K", K);
    } else {
        check_ld("lda", lda, "A", true, "K", K, "M", M);
    }
    if (op_b == Op::N) {
        check_ld("ldb", ldb, "B", false, "K", K, "N", N);
    } else {
        check_ld("ldb", ldb, "B", true, "N", N, "K", K);
    }
    check_ld("ldc", ldc, "C", false, "M", M, "N", N);
    if (M > 0 && N > 0) {
        if (C == nullptr) throw Error(prefix + "C is null for a product of " + gemm_dims(M, N, K));
        if (K > 0 && (A == nullptr || B == nullptr)) {
            throw Error(prefix + (A == nullptr ? "A" : "B") + " is null for a product of " + gemm_dims(M, N, K));
        }
    }
}

// C = beta * C (C = 0 when beta == 0, without reading C): the whole GEMM when
// K == 0 or alpha == 0, as in BLAS, where A and B are not read.
template <class TC>
void gemm_scale_c(gemm_index M, gemm_index N, float beta, TC* C, gemm_index ldc) {  // C: (M, N)
    if (beta == 1.0f) return;
    for (gemm_index i = 0; i < M; ++i) {
        TC* row = C + i * ldc;
        for (gemm_index j = 0; j < N; ++j) {
            row[j] = beta == 0.0f ? TC(0.0f) : TC(beta * static_cast<float>(row[j]));
        }
    }
}

// What both GEMMs do before a product: the argument checks, then the cases
// that need none. Returns true when C is already the answer (M or N is zero;
// K is zero or alpha is: C = beta C), false when the product must be computed.
template <class TC>
bool gemm_needs_no_product(const char* name, Op op_a, Op op_b, gemm_index M, gemm_index N, gemm_index K,
                           float alpha, const void* A, gemm_index lda, const void* B, gemm_index ldb, float beta,
                           TC* C, gemm_index ldc, const std::source_location& loc) {
    check_gemm(name, op_a, op_b, M, N, K, A, lda, B, ldb, C, ldc, loc);
    if (M == 0 || N == 0) return true;
    if (K == 0 || alpha == 0.0f) {
        gemm_scale_c(M, N, beta, C, ldc);
        return true;
    }
    return false;
}

}  // namespace detail
}  // namespace snug::host
