// The CUDA GEMM (snug::cuda::Blas) and linear layer against the host: the
// row-major matmul for every transpose pair against snug::host::gemm,
// linear_forward / linear_backward against snug::host's kernels on fresh
// random inputs of odd sizes, in float (TF32 off and on), half and bfloat16,
// with the bias fused and unfused; the plan cache, the bias gradient's
// determinism, and the errors. Runs only where a GPU exists.
//
// Tolerances: an element's error is measured against the size of the terms it
// sums, |d - h| <= tol * sum |terms| (the usual GEMM error bound, which is
// what "relative error" means for a dot product that may cancel to ~0):
// tol = 1e-5 for fp32, 3e-4 for TF32, 1e-2 for 16-bit outputs (one 16-bit
// ulp is at most 2^-7 of the value) and 1e-3 for fp32 gradients from 16-bit
// inputs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/cuda/blas.hpp"
#include "snug/cuda/linear.cuh"
#include "snug/host/gemm.hpp"
#include "snug/host/linear.hpp"
#include "snug/snug.hpp"
#include "support/cuda_support.hpp"

using Catch::Matchers::Contains;
using snug::Cuda;
using snug::MemoryCategory;
using snug::MemoryTracker;
using snug::cuda::Blas;
using namespace snug::test;

namespace {

// n values uniform in [-1, 1) (never all zero), rounded to T.
template <class T>
std::vector<T> random_vector(snug::Generator& rng, std::size_t n) {
    std::vector<T> out(n);
    for (T& x : out) x = T(rng.uniform() * 2.0f - 1.0f);
    return out;
}

template <class T>
constexpr double gradient_tolerance() {  // fp32 outputs summed from T inputs
    return std::is_same_v<T, float> ? 1e-5 : 1e-3;
}

struct Shape {
    std::int64_t N;
    int C;
    int OC;
};

// Odd sizes: one row, C and OC not multiples of 8 or 32, enough rows for the
// bias gradient to use several chunks.
const Shape linear_shapes[] = {{1, 37, 13}, {67, 96, 7}, {130, 129, 65}, {1000, 64, 200}, {5, 8, 1}};

// The host's answers and the device's for one linear layer, forward and backward.
template <class T>
void compare_linear(Blas& blas, const Shape& s, bool with_bias, double forward_tol, double gradient_tol,
                    std::uint64_t seed) {
    const auto [N, C, OC] = s;
    INFO("N = " << N << ", C = " << C << ", OC = " << OC << ", bias " << with_bias << ", fused "
                << blas.fuse_bias() << ", tf32 " << blas.tf32() << ", seed " << seed);
    const auto n_in = static_cast<std::size_t>(N) * static_cast<std::size_t>(C);
    const auto n_out = static_cast<std::size_t>(N) * static_cast<std::size_t>(OC);
    const auto n_w = static_cast<std::size_t>(OC) * static_cast<std::size_t>(C);
    snug::Generator rng(seed);
    const auto inp = random_vector<T>(rng, n_in);
    const auto weight = random_vector<T>(rng, n_w);
    const auto bias = random_vector<T>(rng, static_cast<std::size_t>(OC));
    const auto dout = random_vector<T>(rng, n_out);
    const auto dweight0 = random_vector<float>(rng, n_w);  // gradients accumulate onto these
    const auto dbias0 = random_vector<float>(rng, static_cast<std::size_t>(OC));

    MemoryTracker tracker;
    const Cuda dev{.stream = nullptr, .blas = &blas};
    auto inp_d = to_device(tracker, inp, "inp");
    auto weight_d = to_device(tracker, weight, "weight");
    auto bias_d = to_device(tracker, bias, "bias");
    auto dout_d = to_device(tracker, dout, "dout");
    auto dweight_d = to_device(tracker, dweight0, "dweight");
    auto dbias_d = to_device(tracker, dbias0, "dbias");
    auto out_d = poisoned<T>(tracker, n_out, "out");
    auto dinp_d = poisoned<T>(tracker, n_in, "dinp");
    const T* bias_ptr = with_bias ? bias_d.data() : nullptr;

    snug::cuda::linear_forward(dev, out_d.data(), inp_d.data(), weight_d.data(), bias_ptr, N, C, OC);
    snug::cuda::linear_backward(dev, dinp_d.data(), dweight_d.data(), with_bias ? dbias_d.data() : nullptr,
                                dout_d.data(), inp_d.data(), weight_d.data(), N, C, OC);
    dev.synchronize();

    std::vector<T> out(n_out), dinp(n_in);
    std::vector<float> dweight = dweight0, dbias = dbias0;
    const snug::Host host;
    snug::host::linear_forward(host, out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr, N,
                               C, OC);
    snug::host::linear_backward(host, dinp.data(), dweight.data(), with_bias ? dbias.data() : nullptr, dout.data(),
                                inp.data(), weight.data(), N, C, OC);

    // The size of the terms each element sums.
    std::vector<double> out_scale(n_out), dinp_scale(n_in), dweight_scale(n_w), dbias_scale(OC);
    for (std::int64_t n = 0; n < N; ++n)
        for (int o = 0; o < OC; ++o) {
            double sum = with_bias ? std::abs(to_double(bias[o])) : 0.0;
            for (int c = 0; c < C; ++c) sum += std::abs(to_double(inp[n * C + c]) * to_double(weight[o * C + c]));
            out_scale[n * OC + o] = sum;
        }
    for (std::int64_t n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c) {
            double sum = 0.0;
            for (int o = 0; o < OC; ++o) sum += std::abs(to_double(dout[n * OC + o]) * to_double(weight[o * C + c]));
            dinp_scale[n * C + c] = sum;
        }
    for (int o = 0; o < OC; ++o) {
        double bias_sum = std::abs(double{dbias0[o]});
        for (std::int64_t n = 0; n < N; ++n) bias_sum += std::abs(to_double(dout[n * OC + o]));
        dbias_scale[o] = bias_sum;
        for (int c = 0; c < C; ++c) {
            double sum = std::abs(double{dweight0[o * C + c]});
            for (std::int64_t n = 0; n < N; ++n)
                sum += std::abs(to_double(dout[n * OC + o]) * to_double(inp[n * C + c]));
            dweight_scale[o * C + c] = sum;
        }
    }
    check_close(to_host(out_d), out, out_scale, forward_tol, "out");
    check_close(to_host(dinp_d), dinp, dinp_scale, forward_tol, "dinp");
    check_close(to_host(dweight_d), dweight, dweight_scale, gradient_tol, "dweight");
    if (with_bias) {
        check_close(to_host(dbias_d), dbias, dbias_scale, gradient_tol, "dbias");
    } else {
        CHECK(to_host(dbias_d) == dbias0);  // untouched
    }
}

}  // namespace

TEMPLATE_TEST_CASE("cuda linear forward and backward match the host", "[cuda][linear]", float, snug::half,
                   snug::bfloat16) {
    const std::uint64_t seed = fresh_seed();
    MemoryTracker tracker;
    Blas blas(tracker);
    for (const Shape& s : linear_shapes) {
        for (const bool fused : {true, false}) {
            blas.set_fuse_bias(fused);
            compare_linear<TestType>(blas, s, true, tolerance<TestType>(), gradient_tolerance<TestType>(),
                                     seed);
        }
        compare_linear<TestType>(blas, s, false, tolerance<TestType>(), gradient_tolerance<TestType>(),
                                 seed + 1);
    }
}

TEST_CASE("cuda linear in float with TF32 stays within 3e-4 of the host", "[cuda][linear]") {
    const std::uint64_t seed = fresh_seed();
    MemoryTracker tracker;
    Blas blas(tracker);
    blas.set_tf32(true);
    // K = C, OC or N of at least a few hundred terms: TF32's ~2^-11 rounding
    // per product averages down well below the tolerance.
    compare_linear<float>(blas, Shape{300, 389, 257}, true, 3e-4, 3e-4, seed);
}

TEST_CASE("cuda Blas::matmul matches the host GEMM for every transpose pair", "[cuda][blas]") {
    using snug::cuda::Op;
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    MemoryTracker tracker;
    Blas blas(tracker);
    const std::int64_t M = 45, N = 23, K = 71;
    const float alpha = 0.75f, beta = -0.5f;
    for (const Op op_a : {Op::N, Op::T}) {
        for (const Op op_b : {Op::N, Op::T}) {
            INFO("op(A) " << (op_a == Op::N ? "N" : "T") << ", op(B) " << (op_b == Op::N ? "N" : "T"));
            // Stored shapes, with leading dimensions longer than a row.
            const std::int64_t a_rows = op_a == Op::N ? M : K, a_cols = op_a == Op::N ? K : M;
            const std::int64_t b_rows = op_b == Op::N ? K : N, b_cols = op_b == Op::N ? N : K;
            const std::int64_t lda = a_cols + 3, ldb = b_cols + 8, ldc = N + 5;
            const auto A = random_vector<snug::bfloat16>(rng, static_cast<std::size_t>(a_rows * lda));
            const auto B = random_vector<snug::bfloat16>(rng, static_cast<std::size_t>(b_rows * ldb));
            const auto C0 = random_vector<float>(rng, static_cast<std::size_t>(M * ldc));
            auto A_d = to_device(tracker, A, "A");
            auto B_d = to_device(tracker, B, "B");
            auto C_d = to_device(tracker, C0, "C");
            blas.matmul(nullptr, op_a, op_b, M, N, K, alpha, A_d.data(), lda, B_d.data(), ldb, beta, C_d.data(), ldc);
            std::vector<float> C = C0;
            const auto host_op = [](Op o) { return o == Op::N ? snug::host::Op::N : snug::host::Op::T; };
            snug::host::gemm(host_op(op_a), host_op(op_b), M, N, K, alpha, A.data(), lda, B.data(), ldb, beta,
                             C.data(), ldc);
            std::vector<double> scale(C.size());
            for (std::int64_t i = 0; i < M; ++i)
                for (std::int64_t j = 0; j < ldc; ++j) {
                    double sum = std::abs(beta * double{C0[i * ldc + j]});
                    if (j < N)
                        for (std::int64_t k = 0; k < K; ++k) {
                            const double a = to_double(op_a == Op::N ? A[i * lda + k] : A[k * lda + i]);
                            const double b = to_double(op_b == Op::N ? B[k * ldb + j] : B[j * ldb + k]);
                            sum += std::abs(alpha * a * b);
                        }
                    scale[i * ldc + j] = j < N ? sum : 1.0;  // the padding must stay as it was
                }
            check_close(to_host(C_d), C, scale, 1e-5, "C");
        }
    }
}

TEST_CASE("cuda Blas caches one plan per problem and records its workspace", "[cuda][blas]") {
    using snug::cuda::Op;
    MemoryTracker tracker;
    {
        Blas blas(tracker);
        int device = 0, major = 0;
        snug::cuda::check(cudaGetDevice(&device));
        snug::cuda::check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        const std::size_t expected = major == 9 ? std::size_t{32} << 20 : std::size_t{4} << 20;
        CHECK(blas.workspace_bytes() == expected);
        CHECK(tracker.current(MemoryCategory::workspace) == expected);
        CHECK(blas.plan_count() == 0);
        // The workspace as scratch: as many T as fit before the ticket
        // counter's 256 bytes, none past that; the counter starts at 0.
        const std::size_t usable = expected - 256;
        CHECK(blas.scratch_capacity<float>() == usable / 4);
        CHECK(blas.scratch_capacity<double>() == usable / 8);
        CHECK(static_cast<void*>(blas.scratch<double>(usable / 8)) == blas.workspace());
        CHECK(blas.scratch<double>(usable / 8 + 1) == nullptr);
        CHECK(blas.scratch<float>(usable / 4 + 1) == nullptr);
        CHECK(static_cast<void*>(blas.ticket_counter()) == static_cast<std::byte*>(blas.workspace()) + usable);
        unsigned ticket = 1;
        snug::cuda::copy_to_host(&ticket, blas.ticket_counter(), 1);
        CHECK(ticket == 0);

        const auto key = blas.key<snug::half, float>(Op::T, Op::N, 64, 96, 128, 64, 96, 96, false);
        const snug::cuda::MatmulPlan& first = blas.plan(key);
        const snug::cuda::MatmulPlan& again = blas.plan(key);
        CHECK(&first == &again);
        CHECK(first.found);
        CHECK(blas.plan_count() == 1);
        CHECK_THAT(key.str(), Contains("A, B half") && Contains("C float") && Contains("M = 64"));

        // A repeated linear shape reuses its plans; a new shape adds its own.
        snug::Generator rng(fresh_seed());
        MemoryTracker scratch;
        const Cuda dev{.stream = nullptr, .blas = &blas};
        auto inp = to_device(scratch, random_vector<snug::bfloat16>(rng, 32 * 48), "inp");
        auto weight = to_device(scratch, random_vector<snug::bfloat16>(rng, 40 * 48), "weight");
        auto bias = to_device(scratch, random_vector<snug::bfloat16>(rng, 40), "bias");
        auto out = poisoned<snug::bfloat16>(scratch, 32 * 40, "out");
        snug::cuda::linear_forward(dev, out.data(), inp.data(), weight.data(), bias.data(), 32, 48, 40);
        const std::size_t after_first = blas.plan_count();
        CHECK(after_first > 1);
        snug::cuda::linear_forward(dev, out.data(), inp.data(), weight.data(), bias.data(), 32, 48, 40);
        CHECK(blas.plan_count() == after_first);
        const auto fused_key = blas.key<snug::bfloat16, snug::bfloat16>(Op::N, Op::T, 32, 40, 48, 48, 48, 40, true);
        CHECK(&blas.plan(fused_key) == &blas.plan(fused_key));
        CHECK(blas.plan_count() == after_first);
        snug::cuda::linear_forward(dev, out.data(), inp.data(), weight.data(), bias.data(), 16, 48, 40);
        CHECK(blas.plan_count() > after_first);

        // TF32 is part of the key.
        const auto fp32 = blas.key<float, float>(Op::N, Op::N, 8, 8, 8, 8, 8, 8, false);
        blas.set_tf32(true);
        const auto tf32 = blas.key<float, float>(Op::N, Op::N, 8, 8, 8, 8, 8, 8, false);
        CHECK(fp32 != tf32);
        CHECK(&blas.plan(fp32) != &blas.plan(tf32));
        dev.synchronize();
    }
    CHECK(tracker.current(MemoryCategory::workspace) == 0);
}

TEST_CASE("cuda linear bias gradient is deterministic and accumulates", "[cuda][linear]") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    MemoryTracker tracker;
    Blas blas(tracker);
    const Cuda dev{.stream = nullptr, .blas = &blas};
    const std::int64_t N = 4099;
    const int C = 24, OC = 77;
    auto inp = to_device(tracker, random_vector<float>(rng, static_cast<std::size_t>(N * C)), "inp");
    auto weight = to_device(tracker, random_vector<float>(rng, static_cast<std::size_t>(OC * C)), "weight");
    const auto dout_host = random_vector<float>(rng, static_cast<std::size_t>(N * OC));
    auto dout = to_device(tracker, dout_host, "dout");
    auto dweight = to_device(tracker, std::vector<float>(static_cast<std::size_t>(OC * C), 0.0f), "dweight");
    const std::vector<float> zeros(static_cast<std::size_t>(OC), 0.0f);
    auto dbias = to_device(tracker, zeros, "dbias");
    snug::cuda::linear_backward(dev, static_cast<float*>(nullptr), dweight.data(), dbias.data(), dout.data(),
                                inp.data(), weight.data(), N, C, OC);
    const auto once = to_host(dbias);
    // Column sums in double: the fp32 kernel is within 1e-5 of them.
    for (int o = 0; o < OC; ++o) {
        double sum = 0.0, size = 0.0;
        for (std::int64_t n = 0; n < N; ++n) {
            sum += dout_host[n * OC + o];
            size += std::abs(double{dout_host[n * OC + o]});
        }
        CHECK(std::abs(once[o] - sum) <= 1e-5 * size);
    }
    // A second call adds the same sums (to the bit, as the same sums are
    // added to the same values in the same order as a fresh run would).
    snug::cuda::linear_backward(dev, static_cast<float*>(nullptr), dweight.data(), dbias.data(), dout.data(),
                                inp.data(), weight.data(), N, C, OC);
    const auto twice = to_host(dbias);
    snug::cuda::copy_to_device(dbias.data(), std::span<const float>(zeros));
    snug::cuda::linear_backward(dev, static_cast<float*>(nullptr), dweight.data(), dbias.data(), dout.data(),
                                inp.data(), weight.data(), N, C, OC);
    CHECK(to_host(dbias) == once);
    for (int o = 0; o < OC; ++o) CHECK(twice[o] == once[o] + once[o]);
}

TEST_CASE("cuda linear with C = 0 writes the bias, or zeros", "[cuda][linear]") {
    MemoryTracker tracker;
    Blas blas(tracker);
    const Cuda dev{.stream = nullptr, .blas = &blas};
    snug::Generator rng(fresh_seed());
    const auto bias = random_vector<snug::half>(rng, 11);
    auto bias_d = to_device(tracker, bias, "bias");
    auto out = poisoned<snug::half>(tracker, 3 * 11, "out");
    snug::cuda::linear_forward(dev, out.data(), static_cast<const snug::half*>(nullptr),
                               static_cast<const snug::half*>(nullptr), bias_d.data(), 3, 0, 11);
    const auto with_bias = to_host(out);
    for (std::size_t i = 0; i < with_bias.size(); ++i) CHECK(with_bias[i].bits == bias[i % 11].bits);
    snug::cuda::linear_forward(dev, out.data(), static_cast<const snug::half*>(nullptr),
                               static_cast<const snug::half*>(nullptr), static_cast<const snug::half*>(nullptr), 3,
                               0, 11);
    for (const snug::half h : to_host(out)) CHECK(h.bits == 0);
}

TEST_CASE("cuda linear and matmul reject bad arguments with clear errors", "[cuda][linear][blas]") {
    using snug::cuda::Op;
    MemoryTracker tracker;
    Blas blas(tracker);
    snug::Buffer<float, Cuda> a(tracker, MemoryCategory::temporaries, 1024, "a");
    snug::Buffer<float, Cuda> b(tracker, MemoryCategory::temporaries, 1024, "b");
    snug::Buffer<float, Cuda> c(tracker, MemoryCategory::temporaries, 1024, "c");

    // No Blas on the tag.
    const Cuda bare{};
    CHECK_THROWS_WITH(snug::cuda::linear_forward(bare, c.data(), a.data(), b.data(), static_cast<const float*>(nullptr),
                                                 4, 8, 8),
                      Contains("linear_forward") && Contains("no Blas"));
    const Cuda dev{.stream = nullptr, .blas = &blas};
    // Negative sizes.
    CHECK_THROWS_AS(snug::cuda::linear_forward(dev, c.data(), a.data(), b.data(), static_cast<const float*>(nullptr),
                                               -1, 8, 8),
                    snug::ShapeError);
    CHECK_THROWS_WITH(snug::cuda::linear_backward(dev, c.data(), b.data(), static_cast<float*>(nullptr), a.data(),
                                                  a.data(), b.data(), 4, -3, 8),
                      Contains("C = -3"));
    // A pointer not aligned to 16 bytes (float + 1 is 4-byte aligned).
    CHECK_THROWS_WITH(snug::cuda::linear_forward(dev, c.data(), a.data() + 1, b.data(),
                                                 static_cast<const float*>(nullptr), 4, 8, 8),
                      Contains("not aligned to 16 bytes") && Contains("M = 4"));
    // Null pointers.
    CHECK_THROWS_AS(snug::cuda::linear_forward(dev, c.data(), static_cast<const float*>(nullptr), b.data(),
                                               static_cast<const float*>(nullptr), 4, 8, 8),
                    snug::Error);
    // Blas::matmul: K = 0, and a leading dimension shorter than a row.
    CHECK_THROWS_AS(blas.matmul(nullptr, Op::N, Op::N, 4, 4, 0, 1.0f, a.data(), 4, b.data(), 4, 0.0f, c.data(), 4),
                    snug::ShapeError);
    CHECK_THROWS_WITH(blas.matmul(nullptr, Op::N, Op::T, 4, 8, 16, 1.0f, a.data(), 15, b.data(), 16, 0.0f,
                                  c.data(), 8),
                      Contains("lda = 15") && Contains("16 elements"));
    CHECK(cudaGetLastError() == cudaSuccess);
}
