// Host GEMM against a naive double-precision product: every transpose pair,
// odd sizes, padded leading dimensions, alpha/beta, NaN-filled C with beta = 0,
// float/half/bfloat16 inputs with float or 16-bit outputs, the OpenBLAS path
// (where built) and each instruction-set variant of the portable kernel.
#include "snug/host/gemm.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace {

// snug::bfloat16 is spelled out: OpenBLAS's <cblas.h>, which gemm.hpp includes
// when snug is built with it, declares a global `bfloat16` (uint16_t).
using snug::half;
using snug::host::Op;
namespace detail = snug::host::detail;

// Which implementation a check runs.
enum class Path { gemm, portable, baseline, avx2, avx512 };

const char* path_name(Path p) {
    switch (p) {
        case Path::gemm: return "gemm";
        case Path::portable: return "gemm_portable";
        case Path::baseline: return "portable/baseline";
        case Path::avx2: return "portable/avx2";
        case Path::avx512: return "portable/avx512";
    }
    return "?";
}

// Every path this machine can run (gemm_portable runs the best variant, which
// is not run a second time).
std::vector<Path> paths() {
    std::vector<Path> out{Path::gemm, Path::portable};
    const auto best = detail::gemm_best_isa();
    for (auto [path, isa] : {std::pair{Path::baseline, detail::GemmIsa::baseline},
                             std::pair{Path::avx2, detail::GemmIsa::avx2},
                             std::pair{Path::avx512, detail::GemmIsa::avx512}}) {
        if (isa != best && detail::gemm_isa_supported(isa)) out.push_back(path);
    }
    return out;
}

template <class T, class TC>
void run(Path p, Op op_a, Op op_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const T* A,
         std::int64_t lda, const T* B, std::int64_t ldb, float beta, TC* C, std::int64_t ldc) {
    switch (p) {
        case Path::gemm:
            snug::host::gemm(op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            return;
        case Path::portable:
            snug::host::gemm_portable(op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            return;
        case Path::baseline:
        case Path::avx2:
        case Path::avx512: {
            // The variants' entry point skips the checks and the trivial cases,
            // which the calls below never hit (M, N, K > 0, alpha != 0).
            const auto isa = p == Path::baseline ? detail::GemmIsa::baseline
                             : p == Path::avx2   ? detail::GemmIsa::avx2
                                                 : detail::GemmIsa::avx512;
            detail::gemm_portable_run(isa, op_a, op_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            return;
        }
    }
}

float to_f(float x) { return x; }
float to_f(half x) { return static_cast<float>(x); }
float to_f(snug::bfloat16 x) { return static_cast<float>(x); }

template <class T>
T nan_of() {
    return T(std::numeric_limits<float>::quiet_NaN());
}

// rows x cols values in [-1, -1/8] u [1/8, 1] (never zero), already rounded to
// T, stored with leading dimension ld; the padding past each row is NaN.
template <class T>
std::vector<T> random_matrix(std::int64_t rows, std::int64_t cols, std::int64_t ld, std::mt19937& rng) {
    std::uniform_real_distribution<float> magnitude(0.125f, 1.0f);
    std::bernoulli_distribution negative(0.5);
    std::vector<T> m(static_cast<std::size_t>(std::max<std::int64_t>(rows * ld, 1)), nan_of<T>());
    for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t c = 0; c < cols; ++c) {
            const float v = magnitude(rng);
            m[static_cast<std::size_t>(r * ld + c)] = T(negative(rng) ? -v : v);
        }
    }
    return m;
}

// op(A) * op(B) in double from the stored (already rounded) values, and
// sum |a||b|, the scale that fp32 rounding errors are measured against.
struct Product {
    std::vector<double> value, abs_sum;  // (M, N)
};

template <class T>
Product product(Op op_a, Op op_b, std::int64_t M, std::int64_t N, std::int64_t K, const std::vector<T>& A,
                std::int64_t lda, const std::vector<T>& B, std::int64_t ldb) {
    // Widen op(A) row by row and op(B) column by column once: the inner loop
    // then runs over contiguous doubles.
    std::vector<double> a(static_cast<std::size_t>(M * K)), b(static_cast<std::size_t>(N * K));
    for (std::int64_t i = 0; i < M; ++i) {
        for (std::int64_t k = 0; k < K; ++k) {
            a[static_cast<std::size_t>(i * K + k)] =
                to_f(A[static_cast<std::size_t>(op_a == Op::N ? i * lda + k : k * lda + i)]);
        }
    }
    for (std::int64_t j = 0; j < N; ++j) {
        for (std::int64_t k = 0; k < K; ++k) {
            b[static_cast<std::size_t>(j * K + k)] =
                to_f(B[static_cast<std::size_t>(op_b == Op::N ? k * ldb + j : j * ldb + k)]);
        }
    }
    const auto mn = static_cast<std::size_t>(M * N);
    Product p{std::vector<double>(mn), std::vector<double>(mn)};
    for (std::int64_t i = 0; i < M; ++i) {
        for (std::int64_t j = 0; j < N; ++j) {
            const double* ai = a.data() + i * K;
            const double* bj = b.data() + j * K;
            double sum = 0, abs_sum = 0;
            for (std::int64_t k = 0; k < K; ++k) {
                sum += ai[k] * bj[k];
                abs_sum += std::fabs(ai[k] * bj[k]);
            }
            p.value[static_cast<std::size_t>(i * N + j)] = sum;
            p.abs_sum[static_cast<std::size_t>(i * N + j)] = abs_sum;
        }
    }
    return p;
}

// alpha * op(A) * op(B) + beta * C in double, and its error scale
// |alpha| sum |a||b| + |beta||c| (C is not read when beta == 0).
struct Reference {
    std::vector<double> value, scale;  // (M, N)
};

template <class TC>
Reference reference(const Product& p, std::int64_t M, std::int64_t N, float alpha, float beta,
                    const std::vector<TC>& C, std::int64_t ldc) {
    Reference ref{p.value, p.abs_sum};
    for (std::int64_t i = 0; i < M; ++i) {
        for (std::int64_t j = 0; j < N; ++j) {
            const auto at = static_cast<std::size_t>(i * N + j);
            ref.value[at] *= alpha;
            ref.scale[at] *= std::fabs(alpha);
            if (beta != 0.0f) {
                const double c = to_f(C[static_cast<std::size_t>(i * ldc + j)]);
                ref.value[at] += beta * c;
                ref.scale[at] += std::fabs(beta * c);
            }
        }
    }
    return ref;
}

// One unit in the last place of a 16-bit type at the magnitude of x.
template <class TC>
double ulp16(double x) {
    constexpr int mantissa_bits = std::is_same_v<TC, half> ? 10 : 7;
    constexpr int min_exponent = std::is_same_v<TC, half> ? -14 : -126;
    const int e = std::max(std::ilogb(std::max(std::fabs(x), std::ldexp(1.0, min_exponent))), min_exponent);
    return std::ldexp(1.0, e - mantissa_bits);
}

template <class T>
bool same_bits(T x, T y) {
    return std::memcmp(&x, &y, sizeof(T)) == 0;
}

// Number of elements of C outside tolerance, plus the first one described;
// the padding past each row of C must be as it was.
template <class TC>
std::string compare(const Reference& ref, std::int64_t M, std::int64_t N, const std::vector<TC>& C,
                    const std::vector<TC>& C_before, std::int64_t ldc) {
    std::int64_t bad = 0;
    std::string first;
    for (std::int64_t i = 0; i < M; ++i) {
        for (std::int64_t j = 0; j < ldc; ++j) {
            const auto at = static_cast<std::size_t>(i * ldc + j);
            if (j >= N) {
                if (!same_bits(C[at], C_before[at])) {
                    if (bad++ == 0) first = fmt::format("padding C({}, {}) was written", i, j);
                }
                continue;
            }
            const double want = ref.value[static_cast<std::size_t>(i * N + j)];
            double tol = 1e-5 * ref.scale[static_cast<std::size_t>(i * N + j)] + 1e-30;
            if constexpr (!std::is_same_v<TC, float>) tol += ulp16<TC>(want);
            const double got = to_f(C[at]);
            if (!(std::fabs(got - want) <= tol)) {
                if (bad++ == 0) {
                    first = fmt::format("C({}, {}) = {} but the reference is {} (tolerance {})", i, j, got,
                                        want, tol);
                }
            }
        }
    }
    return bad == 0 ? std::string() : fmt::format("{} bad elements; first: {}", bad, first);
}

struct Shape {
    std::int64_t M, N, K;
    std::int64_t pad;  // extra elements per stored row, for every operand
};

// Odd sizes and sizes past the blocking (K > 256: depth blocks add up; M > 144:
// several row blocks; N > 2048: several column blocks), with every transpose
// pair.
const std::vector<Shape> shapes = {
    {1, 1, 1, 0},    {1, 7, 33, 1},    {7, 1, 65, 2},    {33, 65, 7, 0},   {65, 33, 129, 3},
    {129, 65, 33, 1}, {50, 40, 300, 5}, {200, 70, 20, 0}, {3, 2100, 5, 2},
};
const std::vector<std::pair<Op, Op>> all_ops = {{Op::N, Op::N}, {Op::N, Op::T}, {Op::T, Op::N}, {Op::T, Op::T}};
// A product large enough to be split over two threads (2 M N K > 8e6), with
// two transpose pairs to keep the test fast.
const std::vector<Shape> threaded_shapes = {{160, 176, 150, 1}};
const std::vector<std::pair<Op, Op>> two_ops = {{Op::N, Op::T}, {Op::T, Op::N}};

// Runs every path on C = alpha * op(A) * op(B) + beta * C for every shape,
// transpose pair, output type in TCs and beta, and compares with the reference.
template <class T, class... TCs>
void check_all_paths(std::mt19937& rng, const std::vector<Shape>& shape_list,
                     const std::vector<std::pair<Op, Op>>& ops, const std::vector<float>& betas) {
    const float alpha = 0.75f;
    for (const Shape& s : shape_list) {
        for (const auto& [op_a, op_b] : ops) {
            const std::int64_t a_rows = op_a == Op::N ? s.M : s.K, a_cols = op_a == Op::N ? s.K : s.M;
            const std::int64_t b_rows = op_b == Op::N ? s.K : s.N, b_cols = op_b == Op::N ? s.N : s.K;
            const std::int64_t lda = a_cols + s.pad, ldb = b_cols + s.pad, ldc = s.N + s.pad;
            const auto A = random_matrix<T>(a_rows, a_cols, lda, rng);
            const auto B = random_matrix<T>(b_rows, b_cols, ldb, rng);
            const Product prod = product(op_a, op_b, s.M, s.N, s.K, A, lda, B, ldb);
            auto check_output = [&]<class TC>(TC*) {
                for (float beta : betas) {
                    auto C0 = random_matrix<TC>(s.M, s.N, ldc, rng);
                    // beta = 0 must not read C: hand it NaN everywhere.
                    if (beta == 0.0f) std::fill(C0.begin(), C0.end(), nan_of<TC>());
                    const Reference ref = reference(prod, s.M, s.N, alpha, beta, C0, ldc);
                    for (Path p : paths()) {
                        auto C = C0;
                        run(p, op_a, op_b, s.M, s.N, s.K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
                        const std::string problem = compare(ref, s.M, s.N, C, C0, ldc);
                        INFO(fmt::format("{}: C {}, op_a {}, op_b {}, M {} N {} K {}, pad {}, alpha {}, beta {}",
                                         path_name(p), std::is_same_v<TC, float> ? "float" : "16-bit",
                                         op_a == Op::N ? "N" : "T", op_b == Op::N ? "N" : "T", s.M, s.N, s.K, s.pad,
                                         alpha, beta));
                        CHECK(problem == "");
                    }
                }
            };
            (check_output(static_cast<TCs*>(nullptr)), ...);
        }
    }
}

}  // namespace

TEST_CASE("fp32 GEMM matches a double-precision product", "[gemm]") {
    std::mt19937 rng(1);
    check_all_paths<float, float>(rng, shapes, all_ops, {0.0f, -1.25f, 1.0f});
    check_all_paths<float, float>(rng, threaded_shapes, two_ops, {0.0f, -1.25f});
}

TEST_CASE("half inputs, float and half outputs", "[gemm]") {
    std::mt19937 rng(2);
    check_all_paths<half, float, half>(rng, shapes, all_ops, {0.0f, -1.25f});
    check_all_paths<half, float, half>(rng, threaded_shapes, two_ops, {0.0f});
}

TEST_CASE("bfloat16 inputs, float and bfloat16 outputs", "[gemm]") {
    std::mt19937 rng(3);
    check_all_paths<snug::bfloat16, float, snug::bfloat16>(rng, shapes, all_ops, {0.0f, 0.5f});
    check_all_paths<snug::bfloat16, float, snug::bfloat16>(rng, threaded_shapes, two_ops, {0.5f});
}

TEST_CASE("a 16-bit C larger than one 512 x 1024 staging tile", "[gemm]") {
    std::mt19937 rng(4);
    check_all_paths<half, half>(rng, {{514, 1030, 2, 1}}, {{Op::T, Op::N}}, {2.0f});
}

TEST_CASE("trivial products: empty C, K = 0, alpha = 0", "[gemm]") {
    for (Path p : {Path::gemm, Path::portable}) {
        INFO(path_name(p));
        const float nan = std::numeric_limits<float>::quiet_NaN();
        // Nothing to do, nothing dereferenced.
        run<float, float>(p, Op::N, Op::N, 0, 5, 3, 1.0f, nullptr, 3, nullptr, 5, 0.0f, nullptr, 5);
        run<float, float>(p, Op::T, Op::N, 4, 0, 3, 1.0f, nullptr, 4, nullptr, 1, 0.0f, nullptr, 1);

        // K = 0: C = beta * C; A and B are not read.
        std::vector<float> C = {1, 2, 3, 4, 5, 6};  // (2, 3)
        run<float, float>(p, Op::N, Op::N, 2, 3, 0, 1.0f, nullptr, 0, nullptr, 3, -2.0f, C.data(), 3);
        CHECK(C == std::vector<float>{-2, -4, -6, -8, -10, -12});

        // alpha = 0: A and B full of NaN are not read; beta = 0 writes zeros over NaN.
        const std::vector<float> A(6, nan), B(9, nan);
        std::vector<float> Cn(6, nan);
        run<float, float>(p, Op::N, Op::N, 2, 3, 3, 0.0f, A.data(), 3, B.data(), 3, 0.0f, Cn.data(), 3);
        CHECK(Cn == std::vector<float>(6, 0.0f));

        std::vector<half> Ch = {half(1.0f), half(-3.0f)};  // (1, 2)
        const std::vector<half> Ah(3, half(nan)), Bh(6, half(nan));
        run<half, half>(p, Op::N, Op::N, 1, 2, 3, 0.0f, Ah.data(), 3, Bh.data(), 2, 0.5f, Ch.data(), 2);
        CHECK(static_cast<float>(Ch[0]) == 0.5f);
        CHECK(static_cast<float>(Ch[1]) == -1.5f);
    }
}

TEST_CASE("a known 2x3 by 3x2 product", "[gemm]") {
    // [1 2 3; 4 5 6] * [7 8; 9 10; 11 12] = [58 64; 139 154], exact in fp32 and bf16/half.
    const std::vector<float> A = {1, 2, 3, 4, 5, 6}, B = {7, 8, 9, 10, 11, 12};
    const std::vector<float> Bt = {7, 9, 11, 8, 10, 12};  // B stored transposed (2, 3)
    for (Path p : paths()) {
        INFO(path_name(p));
        std::vector<float> C(4, -1.0f);
        run(p, Op::N, Op::N, 2, 2, 3, 1.0f, A.data(), 3, B.data(), 2, 0.0f, C.data(), 2);
        CHECK(C == std::vector<float>{58, 64, 139, 154});
        run(p, Op::N, Op::T, 2, 2, 3, 1.0f, A.data(), 3, Bt.data(), 3, 1.0f, C.data(), 2);
        CHECK(C == std::vector<float>{116, 128, 278, 308});

        std::vector<snug::bfloat16> Ab, Bb;
        for (float x : A) Ab.emplace_back(x);
        for (float x : B) Bb.emplace_back(x);
        std::vector<snug::bfloat16> Cb(4, snug::bfloat16(-1.0f));
        run(p, Op::N, Op::N, 2, 2, 3, 1.0f, Ab.data(), 3, Bb.data(), 2, 0.0f, Cb.data(), 2);
        // bf16 keeps 8 significant bits: 139 -> 139 (exact, odd but < 256), 154 exact, 58, 64 exact.
        CHECK(static_cast<float>(Cb[0]) == 58.0f);
        CHECK(static_cast<float>(Cb[1]) == 64.0f);
        CHECK(static_cast<float>(Cb[2]) == 139.0f);
        CHECK(static_cast<float>(Cb[3]) == 154.0f);
    }
}

TEST_CASE("a 16-bit C is rounded once, from the fp32 sum", "[gemm]") {
    // bf16 has 8 significant bits: one ulp at 1 is 2^-7. The fp32 sum
    // 1 + 3 * 2^-9 = 1 + 0.75 ulp rounds up to 1 + 2^-7; had each partial sum
    // been rounded to bf16, every step (1 + 0.25 ulp) would have stayed at 1.
    const float e = std::ldexp(1.0f, -9);
    const std::vector<snug::bfloat16> A = {snug::bfloat16(1.0f), snug::bfloat16(e), snug::bfloat16(e),
                                           snug::bfloat16(e)};  // (1, 4)
    const std::vector<snug::bfloat16> B(4, snug::bfloat16(1.0f));                                             // (4, 1)
    for (Path p : paths()) {
        INFO(path_name(p));
        std::vector<snug::bfloat16> C(1, snug::bfloat16(0.0f));
        run(p, Op::N, Op::N, 1, 1, 4, 1.0f, A.data(), 4, B.data(), 1, 0.0f, C.data(), 1);
        CHECK(static_cast<float>(C[0]) == 1.0f + std::ldexp(1.0f, -7));
    }
}

TEST_CASE("the branch-free half -> float conversion agrees on every bit pattern", "[gemm]") {
    int mismatches = 0;
    std::string first;
    for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
        const auto h = static_cast<std::uint16_t>(bits);
        const float fast = detail::half_to_float_fast(h);
        const float exact = snug::half_bits_to_float(h);
        const bool ok = std::isnan(exact)
                            ? std::isnan(fast)
                            : std::bit_cast<std::uint32_t>(fast) == std::bit_cast<std::uint32_t>(exact);
        if (!ok && mismatches++ == 0) first = fmt::format("bits {:#06x}: fast {} exact {}", bits, fast, exact);
    }
    INFO(first);
    CHECK(mismatches == 0);
}

TEST_CASE("the branch-free float -> half / bfloat16 roundings agree with half.hpp", "[gemm]") {
    // Around every 16-bit value: the value, its neighbours among floats, the
    // midpoints to the next 16-bit value (ties) and the floats beside them;
    // then random bit patterns (NaN, inf, subnormals included).
    std::vector<std::uint32_t> inputs;
    for (std::uint32_t h = 0; h <= 0xFFFF; ++h) {
        for (const float v : {snug::half_bits_to_float(static_cast<std::uint16_t>(h)),
                              snug::bfloat16_bits_to_float(static_cast<std::uint16_t>(h))}) {
            const float next = std::nextafter(v, v < 0 ? -INFINITY : INFINITY);
            const auto bits = std::bit_cast<std::uint32_t>(v);
            for (const std::uint32_t b : {bits, bits + 1, bits - 1, bits + 0x1000U, bits + 0x8000U, bits + 0x7FFFU}) {
                inputs.push_back(b);
            }
            if (std::isfinite(next)) inputs.push_back(std::bit_cast<std::uint32_t>(next));
        }
    }
    std::mt19937 rng(5);
    for (int i = 0; i < 200000; ++i) inputs.push_back(static_cast<std::uint32_t>(rng()));
    std::vector<std::string> mismatches;
    for (const std::uint32_t b : inputs) {
        const float f = std::bit_cast<float>(b);
        const std::uint16_t h = detail::float_to_half_fast(f), h_want = snug::float_to_half_bits(f);
        const std::uint16_t bf = detail::float_to_bfloat16_fast(f), bf_want = snug::float_to_bfloat16_bits(f);
        if (h != h_want) mismatches.push_back(fmt::format("half({:#010x}): {:#06x}, want {:#06x}", b, h, h_want));
        if (bf != bf_want) {
            mismatches.push_back(fmt::format("bfloat16({:#010x}): {:#06x}, want {:#06x}", b, bf, bf_want));
        }
    }
    CHECK(inputs.size() > 900000);
    mismatches.resize(std::min<std::size_t>(mismatches.size(), 5));  // the first few tell enough
    CHECK(fmt::format("{}", fmt::join(mismatches, "; ")) == "");
}

TEST_CASE("bad sizes and leading dimensions throw ShapeError naming them", "[gemm]") {
    const std::vector<float> A(64, 1.0f), B(64, 1.0f);
    std::vector<float> C(64, 0.0f);
    auto call = [&](Op op_a, Op op_b, std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t lda,
                    std::int64_t ldb, std::int64_t ldc) {
        snug::host::gemm(op_a, op_b, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), ldc);
    };
    auto call_portable = [&](Op op_a, Op op_b, std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t lda,
                             std::int64_t ldb, std::int64_t ldc) {
        snug::host::gemm_portable(op_a, op_b, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), ldc);
    };
    using Catch::Contains;
    REQUIRE_THROWS_AS(call(Op::N, Op::N, -1, 2, 2, 2, 2, 2), snug::ShapeError);
    REQUIRE_THROWS_WITH(call(Op::N, Op::N, -1, 2, 2, 2, 2, 2), Contains("negative size (M = -1, N = 2, K = 2)"));
    REQUIRE_THROWS_WITH(call_portable(Op::N, Op::N, 2, 2, -3, 2, 2, 2), Contains("K = -3"));
    REQUIRE_THROWS_WITH(call_portable(Op::N, Op::N, 2, 2, -3, 2, 2, 2), Contains("gemm_portable"));
    // A stored (M, K) = (3, 7) needs lda >= 7.
    REQUIRE_THROWS_AS(call(Op::N, Op::N, 3, 2, 7, 6, 2, 2), snug::ShapeError);
    REQUIRE_THROWS_WITH(call(Op::N, Op::N, 3, 2, 7, 6, 2, 2),
                        Contains("lda = 6") && Contains("A is stored (M, K) = (3, 7)"));
    // Transposed, A is stored (K, M) = (7, 3): lda >= 3 suffices, 2 does not.
    REQUIRE_NOTHROW(call(Op::T, Op::N, 3, 2, 7, 3, 2, 2));
    REQUIRE_THROWS_WITH(call(Op::T, Op::N, 3, 2, 7, 2, 2, 2),
                        Contains("lda = 2") && Contains("A is stored transposed, (K, M) = (7, 3)"));
    REQUIRE_THROWS_WITH(call(Op::N, Op::N, 2, 5, 3, 3, 4, 5), Contains("ldb = 4") && Contains("(K, N) = (3, 5)"));
    REQUIRE_THROWS_WITH(call(Op::N, Op::T, 2, 5, 3, 3, 2, 5), Contains("ldb = 2") && Contains("(N, K) = (5, 3)"));
    REQUIRE_THROWS_AS(call_portable(Op::N, Op::N, 2, 5, 3, 3, 5, 4), snug::ShapeError);
    REQUIRE_THROWS_WITH(call_portable(Op::N, Op::N, 2, 5, 3, 3, 5, 4),
                        Contains("ldc = 4") && Contains("(M, N) = (2, 5)"));
    // The message starts at the caller's line, not inside the library.
    REQUIRE_THROWS_WITH(call(Op::N, Op::N, 2, 5, 3, 3, 5, 4), Contains("gemm_test.cpp:"));
    // A null operand that would be read.
    REQUIRE_THROWS_AS(snug::host::gemm(Op::N, Op::N, 2, 2, 2, 1.0f, static_cast<const float*>(nullptr), 2, B.data(), 2,
                                       0.0f, C.data(), 2),
                      snug::Error);
}

TEST_CASE("parallel_for runs every task once and passes exceptions on", "[gemm][parallel]") {
    for (unsigned threads : {1U, 2U, 5U}) {
        INFO("threads " << threads);
        for (int round = 0; round < 20; ++round) {  // the workers are reused
            std::vector<std::atomic<int>> hits(257);
            snug::host::parallel_for(257, threads, [&](std::int64_t t) { ++hits[static_cast<std::size_t>(t)]; });
            REQUIRE(std::all_of(hits.begin(), hits.end(), [](const std::atomic<int>& h) { return h.load() == 1; }));
        }
        CHECK_THROWS_WITH(snug::host::parallel_for(100, threads,
                                                   [](std::int64_t t) {
                                                       if (t == 37) throw std::runtime_error("task 37");
                                                   }),
                          "task 37");
        // A task may start its own parallel_for (it runs without helpers).
        std::atomic<int> inner{0};
        snug::host::parallel_for(4, threads, [&](std::int64_t) {
            snug::host::parallel_for(10, threads, [&](std::int64_t) { ++inner; });
        });
        CHECK(inner.load() == 40);
    }
    snug::host::parallel_for(0, 4, [](std::int64_t) { FAIL("no task expected"); });
    CHECK(snug::host::max_threads() >= 1);
}

TEST_CASE("SNUG_GEMM_ISA picks the portable GEMM's variant, and names a wrong one", "[gemm]") {
    using detail::GemmIsa;
    CHECK(detail::gemm_isa_from(nullptr) == detail::gemm_isa_from(""));
    CHECK(detail::gemm_isa_from("baseline") == GemmIsa::baseline);
    if (detail::gemm_isa_supported(GemmIsa::avx2)) CHECK(detail::gemm_isa_from("avx2") == GemmIsa::avx2);
    if (!detail::gemm_isa_supported(GemmIsa::avx512))
        CHECK_THROWS_WITH(detail::gemm_isa_from("avx512"),
                          Catch::Equals("SNUG_GEMM_ISA=avx512: this CPU cannot run that variant"));
    CHECK_THROWS_AS(detail::gemm_isa_from("sse9"), snug::ConfigError);
    CHECK_THROWS_WITH(detail::gemm_isa_from("sse9"),
                      Catch::Equals("SNUG_GEMM_ISA=sse9: expected baseline, avx2 or avx512"));
}

TEST_CASE("SNUG_HOST_GEMM picks OpenBLAS or the portable GEMM, and names a wrong value", "[gemm]") {
    CHECK_FALSE(snug::host::gemm_backend_is_cblas("portable"));
#if defined(SNUG_HAVE_CBLAS)
    CHECK(snug::host::gemm_backend_is_cblas(nullptr));
    CHECK(snug::host::gemm_backend_is_cblas("openblas"));
#else
    CHECK_FALSE(snug::host::gemm_backend_is_cblas(nullptr));
    CHECK_THROWS_WITH(snug::host::gemm_backend_is_cblas("openblas"), Catch::Contains("built without OpenBLAS"));
#endif
    CHECK_THROWS_WITH(snug::host::gemm_backend_is_cblas("mkl"),
                      Catch::Equals("SNUG_HOST_GEMM=mkl: expected openblas or portable"));
}
