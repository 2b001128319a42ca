// The host GEMM, row-major: C = alpha * op(A) * op(B) + beta * C for float,
// half and bfloat16 inputs with fp32 accumulation. `gemm` goes through OpenBLAS
// when snug is built with it (SNUG_HAVE_CBLAS) and through `gemm_portable`, a
// cache-blocked kernel with packed panels, otherwise. Its parts: the contract
// (gemm_contract.hpp), the portable kernel (gemm_portable.hpp), the 16-bit
// conversions of both (float16_fast.hpp); here, the choice and the OpenBLAS
// binding.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <source_location>
#include <string>
#include <string_view>

#if defined(SNUG_HAVE_CBLAS)
#include <cblas.h>
#endif

#include "snug/core/error.hpp"
#include "snug/host/float16_fast.hpp"
#include "snug/host/gemm_contract.hpp"
#include "snug/host/gemm_portable.hpp"

namespace snug::host {

// Whether `gemm` sends its work to OpenBLAS's cblas_sgemm (true) or to the
// portable GEMM, for the environment variable SNUG_HOST_GEMM's value `wanted`:
// empty or unset, OpenBLAS where snug is built with it (SNUG_HAVE_CBLAS);
// "portable", the portable GEMM; "openblas", OpenBLAS, which a build without
// it refuses. So one build runs its tests on both (CI does). Anything else
// throws ConfigError naming it.
inline bool gemm_backend_is_cblas(const char* wanted) {
#if defined(SNUG_HAVE_CBLAS)
    constexpr bool built_with_cblas = true;
#else
    constexpr bool built_with_cblas = false;
#endif
    const std::string_view w = wanted == nullptr ? std::string_view() : std::string_view(wanted);
    if (w.empty()) return built_with_cblas;
    if (w == "portable") return false;
    if (w == "openblas") {
        if (!built_with_cblas)
            throw ConfigError("SNUG_HOST_GEMM=openblas: this program was built without OpenBLAS (SNUG_USE_CBLAS)");
        return true;
    }
    throw ConfigError("SNUG_HOST_GEMM=" + std::string(w) + ": expected openblas or portable");
}

// True when `gemm` sends its work to OpenBLAS's cblas_sgemm (decided once,
// from SNUG_HOST_GEMM).
inline bool gemm_uses_cblas() {
    static const bool cblas = gemm_backend_is_cblas(std::getenv("SNUG_HOST_GEMM"));
    return cblas;
}

namespace detail {

#if defined(SNUG_HAVE_CBLAS)
// Through cblas_sgemm; 16-bit inputs are widened to fp32 first (whole
// matrices, in per-thread scratch), a 16-bit C is staged in fp32.
template <class T, class TC>
void gemm_cblas_run(Op op_a, Op op_b, gemm_index M, gemm_index N, gemm_index K, float alpha, const T* A,
                    gemm_index lda, const T* B, gemm_index ldb, float beta, TC* C, gemm_index ldc) {
    const auto trans = [](Op op) { return op == Op::N ? CblasNoTrans : CblasTrans; };
    const auto i = [](gemm_index v) { return static_cast<blasint>(v); };
    if constexpr (std::same_as<T, float>) {
        cblas_sgemm(CblasRowMajor, trans(op_a), trans(op_b), i(M), i(N), i(K), alpha, A, i(lda), B, i(ldb), beta,
                    C, i(ldc));
    } else {
        GemmScratch& scratch = gemm_scratch();
        // Widened copies keep the stored layout, packed (leading dimension = row length).
        const gemm_index a_rows = op_a == Op::N ? M : K, a_cols = op_a == Op::N ? K : M;
        const gemm_index b_rows = op_b == Op::N ? K : N, b_cols = op_b == Op::N ? N : K;
        float* a = scratch.a.get(a_rows * a_cols);
        float* b = scratch.b.get(b_rows * b_cols);
        for (gemm_index r = 0; r < a_rows; ++r) widen(A + r * lda, a_cols, a + r * a_cols);
        for (gemm_index r = 0; r < b_rows; ++r) widen(B + r * ldb, b_cols, b + r * b_cols);
        if constexpr (std::same_as<TC, float>) {
            cblas_sgemm(CblasRowMajor, trans(op_a), trans(op_b), i(M), i(N), i(K), alpha, a, i(a_cols), b,
                        i(b_cols), beta, C, i(ldc));
        } else {
            float* stage = scratch.c.get(M * N);  // (M, N)
            if (beta != 0.0f) {
                for (gemm_index r = 0; r < M; ++r) widen(C + r * ldc, N, stage + r * N);
            }
            cblas_sgemm(CblasRowMajor, trans(op_a), trans(op_b), i(M), i(N), i(K), alpha, a, i(a_cols), b,
                        i(b_cols), beta, stage, i(N));
            for (gemm_index r = 0; r < M; ++r) narrow(stage + r * N, N, C + r * ldc);
        }
        scratch.shrink_to(gemm_scratch_keep);
    }
}

// Whether every size and leading dimension fits CBLAS's integer type.
inline bool gemm_fits_cblas(std::initializer_list<gemm_index> values) {
    return std::all_of(values.begin(), values.end(),
                       [](gemm_index v) { return v <= static_cast<gemm_index>(std::numeric_limits<blasint>::max()); });
}
#endif

}  // namespace detail

// The host GEMM: the same contract as gemm_portable, computed by OpenBLAS's
// cblas_sgemm when snug is built with it and SNUG_HOST_GEMM does not say
// otherwise (gemm_uses_cblas(); 16-bit inputs are widened to fp32 copies
// first), by gemm_portable otherwise.
template <FloatStorage T, class TC>
    requires GemmOutput<TC, T>
void gemm(Op op_a, Op op_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
          const T* A, std::int64_t lda,  // (M, K), or (K, M) when op_a == Op::T
          const T* B, std::int64_t ldb,  // (K, N), or (N, K) when op_b == Op::T
          float beta, TC* C, std::int64_t ldc,  // (M, N)
          std::source_location loc = std::source_location::current()) {
    if (detail::gemm_needs_no_product("gemm", op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, loc)) return;
#if defined(SNUG_HAVE_CBLAS)
    if (gemm_uses_cblas() && detail::gemm_fits_cblas({M, N, K, lda, ldb, ldc})) {
        detail::gemm_cblas_run(op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#endif
    detail::gemm_portable_run(detail::gemm_best_isa(), op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
                              ldc);
}

}  // namespace snug::host
