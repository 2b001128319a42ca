// The portable host GEMM: a cache-blocked kernel on packed panels, its
// micro-kernel compiled for several instruction sets (chosen at run time,
// SNUG_GEMM_ISA), and per-thread scratch. `gemm_portable` is the public entry
// point; gemm.hpp's `gemm` falls back to it where OpenBLAS is not used.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/host/float16_fast.hpp"
#include "snug/host/gemm_contract.hpp"
#include "snug/host/parallel.hpp"

namespace snug::host {
namespace detail {

// ---- scratch memory -------------------------------------------------------------

// A grow-only, 64-byte aligned float buffer.
class ScratchFloats {
public:
    float* get(gemm_index n) {
        const auto want = static_cast<std::size_t>(std::max<gemm_index>(n, 1));
        if (want > capacity_) {
            data_.reset();
            capacity_ = 0;
            data_.reset(static_cast<float*>(Host::allocate(want * sizeof(float))));
            capacity_ = want;
        }
        return data_.get();
    }
    // Frees the buffer when it holds more than `floats`, so that one large call
    // does not keep its memory for the thread's lifetime.
    void shrink_to(std::size_t floats) noexcept {
        if (capacity_ > floats) {
            data_.reset();
            capacity_ = 0;
        }
    }

private:
    struct Free {
        void operator()(float* p) const noexcept { Host::deallocate(p); }
    };
    std::unique_ptr<float, Free> data_;
    std::size_t capacity_ = 0;
};

// Per-thread buffers for packed A and B panels and an fp32 staging copy of C.
struct GemmScratch {
    ScratchFloats a, b, c;
    void shrink_to(std::size_t floats) noexcept {
        a.shrink_to(floats);
        b.shrink_to(floats);
        c.shrink_to(floats);
    }
};

inline GemmScratch& gemm_scratch() {
    thread_local GemmScratch scratch;
    return scratch;
}

// Buffers larger than this (16 Mi floats, 64 MiB) are freed after the call.
inline constexpr std::size_t gemm_scratch_keep = std::size_t{1} << 24;

// Element (row, col) of op(X), X row-major with leading dimension ld.
template <class T>
const T* op_at(Op op, const T* X, gemm_index ld, gemm_index row, gemm_index col) {
    return op == Op::N ? X + row * ld + col : X + col * ld + row;
}

// ---- the portable kernel: tiles, packing, micro-kernel ----------------------------

// A register tile and the cache blocking around it. The micro-kernel keeps an
// MR x NR block of C in MR * NR / W vectors of W floats while it runs over KC
// steps of k; a packed KC x NR panel of B stays in L1/L2, an MC x KC block of A
// in L2, a KC x NC block of B in the last-level cache. KC = 512 measured best
// (fewer passes over C) on Zen 4 for 512..1024 squares, against 128..384.
template <int MR_, int NR_, int W_>
struct GemmTile {
    static constexpr int MR = MR_;  // rows of C per micro-kernel call
    static constexpr int NR = NR_;  // columns of C per micro-kernel call
    static constexpr int W = W_;    // floats per vector register
    static constexpr gemm_index KC = 512;
    static constexpr gemm_index MC = MR * (144 / MR);
    static constexpr gemm_index NC = NR * (2048 / NR);
    static_assert(MR > 0 && NR > 0 && W > 0 && NR % W == 0, "NR must be a whole number of vectors");
};

// FloatVec<W>::type: W floats in one vector register, through the GNU vector
// extension that g++, clang and nvcc's host compilers share (this kernel needs
// it). Spelled out per width: g++ drops a vector_size attribute whose size
// depends on a template parameter.
template <int W>
struct FloatVec;
template <>
struct FloatVec<4> {
    typedef float type __attribute__((vector_size(16)));
};
template <>
struct FloatVec<8> {
    typedef float type __attribute__((vector_size(32)));
};
template <>
struct FloatVec<16> {
    typedef float type __attribute__((vector_size(64)));
};
static_assert(sizeof(FloatVec<16>::type) == 16 * sizeof(float));

// Vector width of the instruction set this translation unit is compiled for.
inline constexpr int native_float_width =
#if defined(__AVX512F__)
    16;
#elif defined(__AVX__)
    8;
#else
    4;  // SSE2 (the x86-64 baseline), NEON
#endif

// Register tiles per instruction set (each measured against 3..5 others of
// its width on Zen 4; within noise of each other, all fill the registers
// without spilling), and the one for the flags this translation unit is
// compiled with.
using GemmTileAvx2 = GemmTile<6, 16, 8>;     // 12 of 16 ymm accumulate
using GemmTileAvx512 = GemmTile<12, 32, 16>;  // 24 of 32 zmm accumulate
using GemmTileSse = GemmTile<6, 8, 4>;        // 12 of 16 xmm accumulate
using GemmTileBaseline =
    std::conditional_t<native_float_width == 16, GemmTileAvx512,
                       std::conditional_t<native_float_width == 8, GemmTileAvx2, GemmTileSse>>;

// Packs rows [0, mc) x depth [0, kc) of op(A) (A points at its element (0, 0))
// into panels of MR rows: panel p holds, for each k, op(A)(p*MR + r, k) for
// r in [0, MR) at out[p*MR*kc + k*MR + r]; rows past mc are zero.
template <int MR, class T>
void pack_a(Op op, const T* A, gemm_index lda, gemm_index mc, gemm_index kc, float* out) {
    for (gemm_index p0 = 0; p0 < mc; p0 += MR, out += MR * kc) {
        const int rows = static_cast<int>(std::min<gemm_index>(MR, mc - p0));
        if (op == Op::N) {  // op(A)(i, k) = A[i*lda + k]: rows are contiguous
            for (int r = 0; r < rows; ++r) {
                const T* src = A + (p0 + r) * lda;
                for (gemm_index k = 0; k < kc; ++k) out[k * MR + r] = to_float(src[k]);
            }
        } else {  // op(A)(i, k) = A[k*lda + i]: each k's MR values are contiguous
            for (gemm_index k = 0; k < kc; ++k) {
                const T* src = A + k * lda + p0;
                for (int r = 0; r < rows; ++r) out[k * MR + r] = to_float(src[r]);
            }
        }
        for (int r = rows; r < MR; ++r) {
            for (gemm_index k = 0; k < kc; ++k) out[k * MR + r] = 0.0f;
        }
    }
}

// Packs depth [0, kc) x columns [0, nc) of op(B) (B points at its element
// (0, 0)) into panels of NR columns: panel q holds op(B)(k, q*NR + c) at
// out[q*NR*kc + k*NR + c]; columns past nc are zero.
template <int NR, class T>
void pack_b(Op op, const T* B, gemm_index ldb, gemm_index kc, gemm_index nc, float* out) {
    for (gemm_index q0 = 0; q0 < nc; q0 += NR, out += NR * kc) {
        const int cols = static_cast<int>(std::min<gemm_index>(NR, nc - q0));
        if (op == Op::N) {  // op(B)(k, n) = B[k*ldb + n]: each k's NR values are contiguous
            for (gemm_index k = 0; k < kc; ++k) {
                const T* src = B + k * ldb + q0;
                for (int c = 0; c < cols; ++c) out[k * NR + c] = to_float(src[c]);
            }
        } else {  // op(B)(k, n) = B[n*ldb + k]: columns are contiguous
            for (int c = 0; c < cols; ++c) {
                const T* src = B + (q0 + c) * ldb;
                for (gemm_index k = 0; k < kc; ++k) out[k * NR + c] = to_float(src[k]);
            }
        }
        for (int c = cols; c < NR; ++c) {
            for (gemm_index k = 0; k < kc; ++k) out[k * NR + c] = 0.0f;
        }
    }
}

// Calls f(std::integral_constant<int, 0>{}), ..., f(std::integral_constant<int, N - 1>{}):
// a loop unrolled at compile time, whatever the optimisation level or compiler.
template <class F, int... I>
[[gnu::always_inline]] inline void unroll_impl(F& f, std::integer_sequence<int, I...>) {
    (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class F>
[[gnu::always_inline]] inline void unroll(F&& f) {
    unroll_impl(f, std::make_integer_sequence<int, N>{});
}

// acc (MR, NR) = sum over k < kc of a(:, k) * b(k, :), from one packed panel
// of A (kc x MR) and one of B (kc x NR). Written with vector types and
// unrolled loops of fixed length so that the accumulators live in registers.
template <class Tile>
[[gnu::always_inline]] inline void micro_kernel(gemm_index kc, const float* a, const float* b,
                                                float* acc_out) {  // acc_out: (MR, NR)
    constexpr int MR = Tile::MR;
    constexpr int NV = Tile::NR / Tile::W;
    using vec = typename FloatVec<Tile::W>::type;
    vec acc[MR][NV];
    // A named zero, not `vec{}` inside the lambda: nvcc 13 (which also compiles
    // lambdas for the device under --expt-relaxed-constexpr) crashes on a
    // vector-type constant there.
    const vec zero{};
    // The lambdas are always_inline too: even unoptimised builds then
    // compile this into straight-line code.
    unroll<MR>([&](auto i) __attribute__((always_inline)) {
        unroll<NV>([&](auto v) __attribute__((always_inline)) { acc[i][v] = zero; });
    });
    for (gemm_index k = 0; k < kc; ++k, a += MR, b += Tile::NR) {
        vec bv[NV];
        unroll<NV>([&](auto v) __attribute__((always_inline)) {
            std::memcpy(&bv[v], b + v * Tile::W, sizeof(vec));
        });
        unroll<MR>([&](auto i) __attribute__((always_inline)) {
            const float ai = a[i];
            unroll<NV>([&](auto v) __attribute__((always_inline)) { acc[i][v] += ai * bv[v]; });
        });
    }
    std::memcpy(acc_out, acc, sizeof(acc));
}

// C (rows, cols) = alpha * acc + beta * C; C is not read when beta == 0.
inline void store_tile(const float* acc, int acc_ld, int rows, int cols, float alpha, float beta, float* C,
                       gemm_index ldc) {
    for (int i = 0; i < rows; ++i) {
        const float* src = acc + i * acc_ld;
        float* dst = C + i * ldc;
        if (beta == 0.0f) {
            for (int j = 0; j < cols; ++j) dst[j] = alpha * src[j];
        } else if (beta == 1.0f) {
            for (int j = 0; j < cols; ++j) dst[j] += alpha * src[j];
        } else {
            for (int j = 0; j < cols; ++j) dst[j] = alpha * src[j] + beta * dst[j];
        }
    }
}

// What the macro-kernel works on: a packed MC x KC block of A, a packed KC x NC
// block of B, and the mc x nc block of C they update.
struct GemmBlock {
    gemm_index mc, nc, kc;
    const float* a;  // packed (mc rounded up to MR, kc)
    const float* b;  // packed (kc, nc rounded up to NR)
    float* c;        // (mc, nc), leading dimension ldc
    gemm_index ldc;
    float alpha, beta;
};

// Every register tile of one block: B's micro-panel stays in cache while the
// MR-row panels of A stream past it.
template <class Tile>
[[gnu::always_inline]] inline void macro_kernel(const GemmBlock& blk) {
    alignas(64) float acc[Tile::MR * Tile::NR];
    for (gemm_index j = 0; j < blk.nc; j += Tile::NR) {
        const float* b = blk.b + j * blk.kc;
        const int cols = static_cast<int>(std::min<gemm_index>(Tile::NR, blk.nc - j));
        for (gemm_index i = 0; i < blk.mc; i += Tile::MR) {
            micro_kernel<Tile>(blk.kc, blk.a + i * blk.kc, b, acc);
            const int rows = static_cast<int>(std::min<gemm_index>(Tile::MR, blk.mc - i));
            store_tile(acc, Tile::NR, rows, cols, blk.alpha, blk.beta, blk.c + i * blk.ldc + j, blk.ldc);
        }
    }
}

// The macro-kernel once per instruction set: the x86 variants are compiled
// for AVX2 / AVX-512 whatever the flags of the translation unit, and chosen at
// run time from what the CPU supports.
enum class GemmIsa { baseline, avx2, avx512 };

inline void macro_kernel_baseline(const GemmBlock& blk) { macro_kernel<GemmTileBaseline>(blk); }
#if defined(__x86_64__) && defined(__GNUC__)
[[gnu::target("avx2,fma")]] inline void macro_kernel_avx2(const GemmBlock& blk) {
    macro_kernel<GemmTileAvx2>(blk);
}
[[gnu::target("avx512f,avx2,fma")]] inline void macro_kernel_avx512(const GemmBlock& blk) {
    macro_kernel<GemmTileAvx512>(blk);
}
#endif

// Whether this CPU runs the given variant.
inline bool gemm_isa_supported(GemmIsa isa) noexcept {
    if (isa == GemmIsa::baseline) return true;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return isa == GemmIsa::avx2 ? avx2 : avx2 && __builtin_cpu_supports("avx512f");
#else
    return false;
#endif
}

inline constexpr const char* gemm_isa_name(GemmIsa isa) noexcept {
    return isa == GemmIsa::avx512 ? "avx512" : isa == GemmIsa::avx2 ? "avx2" : "baseline";
}

// The variant the portable GEMM runs (decided once): the fastest this CPU
// runs, or the one the environment variable SNUG_GEMM_ISA names (baseline,
// avx2, avx512), so that tests can run another CPU's kernels, whose sums
// round in another order. A name it does not know, or a variant this CPU
// cannot run, throws ConfigError naming it.
inline GemmIsa gemm_isa_from(const char* wanted) {
    if (wanted == nullptr || *wanted == '\0')
        return gemm_isa_supported(GemmIsa::avx512) ? GemmIsa::avx512
               : gemm_isa_supported(GemmIsa::avx2) ? GemmIsa::avx2
                                                   : GemmIsa::baseline;
    for (GemmIsa i : {GemmIsa::baseline, GemmIsa::avx2, GemmIsa::avx512}) {
        if (std::string_view(wanted) != gemm_isa_name(i)) continue;
        if (!gemm_isa_supported(i))
            throw ConfigError(std::string("SNUG_GEMM_ISA=") + wanted + ": this CPU cannot run that variant");
        return i;
    }
    throw ConfigError(std::string("SNUG_GEMM_ISA=") + wanted + ": expected baseline, avx2 or avx512");
}
inline GemmIsa gemm_best_isa() {
    static const GemmIsa isa = gemm_isa_from(std::getenv("SNUG_GEMM_ISA"));
    return isa;
}

// One thread's share: C (M, N) = alpha * op(A) * op(B) + beta * C with fp32 C,
// blocked for the caches around the register tile `Tile`.
template <class Tile, class T>
void gemm_blocked(void (*macro)(const GemmBlock&), Op op_a, Op op_b, gemm_index M, gemm_index N,
                  gemm_index K, float alpha,
                  const T* A, gemm_index lda,  // (M, K), or (K, M) when op_a == Op::T
                  const T* B, gemm_index ldb,  // (K, N), or (N, K) when op_b == Op::T
                  float beta, float* C, gemm_index ldc,  // (M, N)
                  GemmScratch& scratch) {
    const gemm_index kc_max = std::min(Tile::KC, K);
    const gemm_index mc_max = std::min(Tile::MC, (M + Tile::MR - 1) / Tile::MR * Tile::MR);
    const gemm_index nc_max = std::min(Tile::NC, (N + Tile::NR - 1) / Tile::NR * Tile::NR);
    float* packed_a = scratch.a.get(mc_max * kc_max);
    float* packed_b = scratch.b.get(kc_max * nc_max);
    for (gemm_index jc = 0; jc < N; jc += Tile::NC) {
        const gemm_index nc = std::min(Tile::NC, N - jc);
        for (gemm_index pc = 0; pc < K; pc += Tile::KC) {
            const gemm_index kc = std::min(Tile::KC, K - pc);
            pack_b<Tile::NR>(op_b, op_at(op_b, B, ldb, pc, jc), ldb, kc, nc, packed_b);
            // Later depth blocks add to what the first one wrote.
            const float beta_block = pc == 0 ? beta : 1.0f;
            for (gemm_index ic = 0; ic < M; ic += Tile::MC) {
                const gemm_index mc = std::min(Tile::MC, M - ic);
                pack_a<Tile::MR>(op_a, op_at(op_a, A, lda, ic, pc), lda, mc, kc, packed_a);
                macro(GemmBlock{mc, nc, kc, packed_a, packed_b, C + ic * ldc + jc, ldc, alpha, beta_block});
            }
        }
    }
}

template <class T>
void gemm_blocked_isa(GemmIsa isa, Op op_a, Op op_b, gemm_index M, gemm_index N, gemm_index K, float alpha,
                      const T* A, gemm_index lda, const T* B, gemm_index ldb, float beta, float* C,
                      gemm_index ldc, GemmScratch& scratch) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (isa == GemmIsa::avx512) {
        gemm_blocked<GemmTileAvx512>(macro_kernel_avx512, op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta,
                                     C, ldc, scratch);
        return;
    }
    if (isa == GemmIsa::avx2) {
        gemm_blocked<GemmTileAvx2>(macro_kernel_avx2, op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
                                   ldc, scratch);
        return;
    }
#endif
    (void)isa;
    gemm_blocked<GemmTileBaseline>(macro_kernel_baseline, op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
                                   ldc, scratch);
}

// How C is cut into independent tiles, one task each.
struct GemmTiles {
    gemm_index rows, cols;      // of a full tile
    gemm_index n_rows, n_cols;  // tiles down and across
    gemm_index count() const { return n_rows * n_cols; }
};

// Tiles of at most max_rows x max_cols, halved (rows a multiple of align_rows,
// columns of align_cols) until there are at least min_tiles.
inline GemmTiles plan_gemm_tiles(gemm_index M, gemm_index N, gemm_index max_rows, gemm_index max_cols,
                                 gemm_index min_tiles, gemm_index align_rows, gemm_index align_cols) {
    auto ceil_div = [](gemm_index a, gemm_index b) { return (a + b - 1) / b; };
    gemm_index rows = std::min(M, max_rows);
    gemm_index cols = std::min(N, max_cols);
    while (ceil_div(M, rows) * ceil_div(N, cols) < min_tiles) {
        const bool can_rows = rows > align_rows;
        const bool can_cols = cols > align_cols;
        if (can_rows && (!can_cols || rows >= cols)) {
            rows = ceil_div(ceil_div(rows, 2), align_rows) * align_rows;
        } else if (can_cols) {
            cols = ceil_div(ceil_div(cols, 2), align_cols) * align_cols;
        } else {
            break;
        }
    }
    return {rows, cols, ceil_div(M, rows), ceil_div(N, cols)};
}

// Work worth one more thread (waking a worker costs microseconds, and each
// thread packs its own copy of the shared operand panels).
inline constexpr double gemm_flops_per_thread = 4e6;

// The portable GEMM with a chosen instruction-set variant (tests run each one
// the CPU supports). Sizes and pointers are already checked, M, N, K > 0.
template <class T, class TC>
void gemm_portable_run(GemmIsa isa, Op op_a, Op op_b, gemm_index M, gemm_index N, gemm_index K, float alpha,
                       const T* A, gemm_index lda, const T* B, gemm_index ldb, float beta, TC* C,
                       gemm_index ldc) {
    const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
    const auto threads =
        static_cast<unsigned>(std::clamp(flops / gemm_flops_per_thread, 1.0, static_cast<double>(max_threads())));
    // A 16-bit C is computed tile by tile in an fp32 staging buffer.
    constexpr bool staged = !std::same_as<TC, float>;
    const gemm_index max_rows = staged ? 512 : M;
    const gemm_index max_cols = staged ? 1024 : N;
    const GemmTiles tiles = plan_gemm_tiles(M, N, max_rows, max_cols, threads, 48, 32);

    parallel_for(tiles.count(), threads, [&](std::int64_t t) {
        const gemm_index i0 = (t / tiles.n_cols) * tiles.rows;
        const gemm_index j0 = (t % tiles.n_cols) * tiles.cols;
        const gemm_index mt = std::min(tiles.rows, M - i0);
        const gemm_index nt = std::min(tiles.cols, N - j0);
        const T* a = op_at(op_a, A, lda, i0, 0);
        const T* b = op_at(op_b, B, ldb, 0, j0);
        TC* c = C + i0 * ldc + j0;
        GemmScratch& scratch = gemm_scratch();
        if constexpr (!staged) {
            gemm_blocked_isa(isa, op_a, op_b, mt, nt, K, alpha, a, lda, b, ldb, beta, c, ldc, scratch);
        } else {
            float* stage = scratch.c.get(mt * nt);  // (mt, nt)
            if (beta != 0.0f) {
                for (gemm_index i = 0; i < mt; ++i) widen(c + i * ldc, nt, stage + i * nt);
            }
            gemm_blocked_isa(isa, op_a, op_b, mt, nt, K, alpha, a, lda, b, ldb, beta, stage, nt, scratch);
            for (gemm_index i = 0; i < mt; ++i) narrow(stage + i * nt, nt, c + i * ldc);
        }
    });
}

}  // namespace detail

// C = alpha * op(A) * op(B) + beta * C, row-major, with leading dimensions
// (elements between the starts of consecutive stored rows). Accumulates in
// fp32; a 16-bit C is rounded to nearest even once, at the end. When
// beta == 0, C is only written (it may hold anything, NaN included); when
// alpha == 0 or K == 0, A and B are not read. C must not overlap A or B.
// Portable blocked kernel, on up to max_threads() threads; the same result
// as `gemm` up to fp32 rounding order.
// Throws ShapeError for a negative size or a leading dimension shorter than
// the stored row (lda >= K, or M when op_a == T; ldb >= N, or K when op_b == T;
// ldc >= N), and snug::Error for a null pointer that would be used.
template <FloatStorage T, class TC>
    requires GemmOutput<TC, T>
void gemm_portable(Op op_a, Op op_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                   const T* A, std::int64_t lda,  // (M, K), or (K, M) when op_a == Op::T
                   const T* B, std::int64_t ldb,  // (K, N), or (N, K) when op_b == Op::T
                   float beta, TC* C, std::int64_t ldc,  // (M, N)
                   std::source_location loc = std::source_location::current()) {
    if (detail::gemm_needs_no_product("gemm_portable", op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, loc)) return;
    detail::gemm_portable_run(detail::gemm_best_isa(), op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C,
                              ldc);
}

}  // namespace snug::host
