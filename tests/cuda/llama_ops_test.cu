// The CUDA kernels for Llama-style blocks (RMSNorm, SwiGLU, RoPE) against the
// host kernels on fresh random inputs (never zero), outputs poisoned with NaN
// first, for float, bfloat16 and half. Calls are unqualified with the device
// tag first, as layers make them. Runs only where a GPU exists (and emulated
// everywhere).
//
// Tolerances (DESIGN.md), relative to |host| + rms(host):
// - RMSNorm: rstd and the fp32 dweight within 1e-5 for every T (fp32 sums in
//   another order); out and dinp within 1e-5 (fp32) or 1e-2 (16-bit: one
//   16-bit ulp where the fp32 values straddle a rounding boundary). The
//   backward is LayerNorm's one launch without the mean and the bias
//   (norm_rows.cuh), tested as layernorm_test.cu tests it: many blocks, fewer
//   rows than SMs, C = 1600 and 2048, two slices of channels, twice over the
//   same gradients (+=, the ticket counter back at 0), the same bits with and
//   without a Blas and on every run.
// - SwiGLU: only the exponential differs (expf against std::exp, an ulp or
//   two): 1e-5 (fp32) or 1e-2 (16-bit).
// - RoPE: cos and sin come from the same double expression on both sides and
//   are rounded to fp32, the rotation is two fp32 products and a sum (the GPU
//   may fuse one into an FMA): 1e-5 (fp32) or 1e-2 (16-bit), at positions up
//   to 4100 and for theta 10^4 and 5 * 10^5. In place must equal out of
//   place, bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "snug/cuda/rmsnorm.cuh"
#include "snug/cuda/rope.cuh"
#include "snug/cuda/swiglu.cuh"
#include "snug/host/rmsnorm.hpp"
#include "snug/host/rope.hpp"
#include "snug/host/swiglu.hpp"
#include "snug/snug.hpp"
#include "support/cuda_support.hpp"

using Catch::Matchers::Contains;
using snug::Cuda;
using snug::MemoryTracker;
using namespace snug::test;

namespace {

template <class T>
void check_rmsnorm(snug::Generator& rng, std::int64_t N, int C, double eps) {
    INFO("N = " << N << ", C = " << C << ", eps = " << eps);
    MemoryTracker tracker;
    const snug::Host host;
    snug::cuda::Blas blas(tracker);
    Cuda dev{};  // partial sums in memory from the stream's pool
    Cuda dev_blas{};
    dev_blas.blas = &blas;  // partial sums in the Blas workspace
    const auto n = static_cast<std::size_t>(N) * static_cast<std::size_t>(C);
    const auto rows = static_cast<std::size_t>(N);
    const auto inp = random_values<T>(rng, n, -2.0f, 3.0f);
    const auto weight = random_values<T>(rng, static_cast<std::size_t>(C), 0.5f, 1.5f);
    const auto dout = random_values<T>(rng, n, -1.0f, 1.0f);
    const auto dinp0 = random_values<T>(rng, n, -1.0f, 1.0f);  // both gradients accumulate
    const auto dweight0 = random_values<float>(rng, static_cast<std::size_t>(C), -1.0f, 1.0f);

    auto inp_d = to_device(tracker, inp);
    auto weight_d = to_device(tracker, weight);
    auto out_d = poisoned<T>(tracker, n);
    auto rstd_d = poisoned<float>(tracker, rows);
    rmsnorm_forward(dev, out_d.data(), rstd_d.data(), inp_d.data(), weight_d.data(), N, C, eps);
    std::vector<T> out(n);
    std::vector<float> rstd(rows);
    rmsnorm_forward(host, out.data(), rstd.data(), inp.data(), weight.data(), N, C, eps);
    check_close(to_host(out_d), out, tolerance<T>(), "out");
    check_close(to_host(rstd_d), rstd, 1e-5, "rstd");

    // The backward from the host's rstd, on both sides, twice over the same gradients.
    auto host_rstd_d = to_device(tracker, rstd);
    auto dout_d = to_device(tracker, dout);
    auto dinp_d = to_device(tracker, dinp0);
    auto dweight_d = to_device(tracker, dweight0);
    std::vector<T> dinp = dinp0;
    std::vector<float> dweight = dweight0;
    for (int pass = 1; pass <= 2; ++pass) {
        INFO("backward pass " << pass);
        rmsnorm_backward(dev_blas, dinp_d.data(), dweight_d.data(), dout_d.data(), inp_d.data(), weight_d.data(),
                         host_rstd_d.data(), N, C);
        rmsnorm_backward(host, dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rstd.data(), N,
                         C);
        check_close(to_host(dinp_d), dinp, tolerance<T>(), "dinp");
        check_close(to_host(dweight_d), dweight, 1e-5, "dweight");
        unsigned ticket = 1;
        snug::cuda::copy_to_host(&ticket, blas.ticket_counter(), 1);
        CHECK(ticket == 0);  // the last block put it back
    }

    // Without a Blas: the same launch, the same bits.
    auto dinp2_d = to_device(tracker, dinp0);
    auto dweight2_d = to_device(tracker, dweight0);
    for (int pass = 1; pass <= 2; ++pass)
        rmsnorm_backward(dev, dinp2_d.data(), dweight2_d.data(), dout_d.data(), inp_d.data(), weight_d.data(),
                         host_rstd_d.data(), N, C);
    check_same_bits(to_host(dinp2_d), to_host(dinp_d), "dinp without a Blas");
    check_same_bits(to_host(dweight2_d), to_host(dweight_d), "dweight without a Blas");
}

template <class T>
void check_swiglu(snug::Generator& rng, std::int64_t N, int H) {
    INFO("N = " << N << ", H = " << H);
    MemoryTracker tracker;
    const snug::Host host;
    const Cuda dev{};
    const auto n_out = static_cast<std::size_t>(N) * static_cast<std::size_t>(H);
    const auto inp = random_values<T>(rng, 2 * n_out, -6.0f, 6.0f);  // both tails of the sigmoid
    const auto dout = random_values<T>(rng, n_out, -1.0f, 1.0f);

    auto inp_d = to_device(tracker, inp);
    auto out_d = poisoned<T>(tracker, n_out);
    swiglu_forward(dev, out_d.data(), inp_d.data(), N, H);
    std::vector<T> out(n_out);
    swiglu_forward(host, out.data(), inp.data(), N, H);
    check_close(to_host(out_d), out, tolerance<T>(), "out");

    auto dout_d = to_device(tracker, dout);
    auto dinp_d = poisoned<T>(tracker, 2 * n_out);  // overwritten, both halves
    swiglu_backward(dev, dinp_d.data(), inp_d.data(), dout_d.data(), N, H);
    std::vector<T> dinp(2 * n_out);
    swiglu_backward(host, dinp.data(), inp.data(), dout.data(), N, H);
    check_close(to_host(dinp_d), dinp, tolerance<T>(), "dinp");
}

struct RopeCase {
    int B, T, NH, hs;
    double theta;
    std::int64_t offset;
};

template <class T>
void check_rope(snug::Generator& rng, RopeCase c) {
    INFO("B, T, NH, hs = " << c.B << ", " << c.T << ", " << c.NH << ", " << c.hs << "; theta " << c.theta
                           << ", offset " << c.offset);
    MemoryTracker tracker;
    const snug::Host host;
    const Cuda dev{};
    const auto n = static_cast<std::size_t>(c.B) * c.T * c.NH * c.hs;
    const auto x = random_values<T>(rng, n, -2.0f, 2.0f);
    const auto dout = random_values<T>(rng, n, -1.0f, 1.0f);

    auto x_d = to_device(tracker, x);
    auto out_d = poisoned<T>(tracker, n);
    rope_forward(dev, out_d.data(), x_d.data(), c.B, c.T, c.NH, c.hs, c.theta, c.offset);
    std::vector<T> out(n);
    rope_forward(host, out.data(), x.data(), c.B, c.T, c.NH, c.hs, c.theta, c.offset);
    const auto out_dev = to_host(out_d);
    check_close(out_dev, out, tolerance<T>(), "out");

    auto dout_d = to_device(tracker, dout);
    auto dinp_d = poisoned<T>(tracker, n);
    rope_backward(dev, dinp_d.data(), dout_d.data(), c.B, c.T, c.NH, c.hs, c.theta, c.offset);
    std::vector<T> dinp(n);
    rope_backward(host, dinp.data(), dout.data(), c.B, c.T, c.NH, c.hs, c.theta, c.offset);
    const auto dinp_dev = to_host(dinp_d);
    check_close(dinp_dev, dinp, tolerance<T>(), "dinp");

    // In place: the same bits as out of place.
    rope_forward(dev, x_d.data(), x_d.data(), c.B, c.T, c.NH, c.hs, c.theta, c.offset);
    check_same_bits(to_host(x_d), out_dev, "out (in place)");
    rope_backward(dev, dout_d.data(), dout_d.data(), c.B, c.T, c.NH, c.hs, c.theta, c.offset);
    check_same_bits(to_host(dout_d), dinp_dev, "dinp (in place)");
}

}  // namespace

TEMPLATE_TEST_CASE("cuda rmsnorm forward and backward match the host", "[cuda][rmsnorm]", float, snug::bfloat16,
                   snug::half) {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    // Vectorised (C a multiple of 4 floats or 8 16-bit values) and one value
    // at a time; many blocks, fewer rows than SMs, one row; two slices.
    const std::pair<std::int64_t, int> sizes[] = {{1, 1},    {3, 1},     {1, 37},    {7, 100},  {64, 768},
                                                  {1000, 33}, {5, 1601},  {2, 8},     {9, 1000}, {4099, 64},
                                                  {100, 40},  {1, 2048},  {33, 1600}, {2, 60000}, {2, 60001}};
    for (const auto& [N, C] : sizes) check_rmsnorm<TestType>(rng, N, C, snug::ops::rmsnorm_eps);
    check_rmsnorm<TestType>(rng, 9, 65, 1e-6);  // Llama 1's eps
}

TEST_CASE("cuda rmsnorm backward is deterministic, on a stream of its own", "[cuda][rmsnorm]") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    MemoryTracker tracker;
    cudaStream_t stream = nullptr;
    snug::cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    snug::cuda::Blas blas(tracker);
    Cuda dev{stream};
    dev.blas = &blas;  // 33 blocks of 32 rows at a time, then the last block's sum
    const std::int64_t N = 1031;
    const int C = 320;
    const auto n = static_cast<std::size_t>(N) * C;
    auto inp_d = to_device(tracker, random_values<float>(rng, n, -2.0f, 3.0f));
    auto weight_d = to_device(tracker, random_values<float>(rng, C, 0.5f, 1.5f));
    auto dout_d = to_device(tracker, random_values<float>(rng, n, -1.0f, 1.0f));
    const auto dinp0 = random_values<float>(rng, n, -1.0f, 1.0f);
    const auto dweight0 = random_values<float>(rng, C, -1.0f, 1.0f);
    auto out_d = poisoned<float>(tracker, n);
    auto rstd_d = poisoned<float>(tracker, static_cast<std::size_t>(N));
    rmsnorm_forward(dev, out_d.data(), rstd_d.data(), inp_d.data(), weight_d.data(), N, C);
    std::vector<float> first_dinp, first_dweight;
    for (int run = 0; run < 3; ++run) {
        auto dinp_d = to_device(tracker, dinp0);
        auto dweight_d = to_device(tracker, dweight0);
        rmsnorm_backward(dev, dinp_d.data(), dweight_d.data(), dout_d.data(), inp_d.data(), weight_d.data(),
                         rstd_d.data(), N, C);
        dev.synchronize();  // the copies below run on the default stream, which does not wait for this one
        if (run == 0) {
            first_dinp = to_host(dinp_d);
            first_dweight = to_host(dweight_d);
        } else {
            const std::string tag = ", run " + std::to_string(run);
            check_same_bits(to_host(dinp_d), first_dinp, "dinp" + tag);
            check_same_bits(to_host(dweight_d), first_dweight, "dweight" + tag);
        }
    }
    snug::cuda::check(cudaStreamDestroy(stream));
}

TEMPLATE_TEST_CASE("cuda swiglu forward and backward match the host", "[cuda][swiglu]", float, snug::bfloat16,
                   snug::half) {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const std::pair<std::int64_t, int> sizes[] = {{1, 1}, {3, 5}, {7, 100}, {64, 768}, {1000, 33}};
    for (const auto& [N, H] : sizes) check_swiglu<TestType>(rng, N, H);
}

TEMPLATE_TEST_CASE("cuda rope forward and backward match the host, in place and out of place", "[cuda][rope]", float,
                   snug::bfloat16, snug::half) {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const RopeCase cases[] = {{1, 1, 1, 2, 10000.0, 0},   {2, 7, 3, 10, 10000.0, 0},  {2, 65, 4, 64, 10000.0, 0},
                              {1, 3, 5, 128, 500000.0, 0}, {2, 5, 2, 16, 10000.0, 4093}};
    for (const RopeCase& c : cases) check_rope<TestType>(rng, c);
}

TEMPLATE_TEST_CASE("cuda rope with a row stride matches the host on a fused qkv and leaves v's bits alone",
                   "[cuda][rope]", float, snug::bfloat16, snug::half) {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    MemoryTracker tracker;
    const snug::Host host;
    const Cuda dev{};
    const int B = 2, T = 33, NHq = 3, hs = 16;  // rows [q | k | v] of 3 NHq heads
    const std::int64_t row = 3 * NHq * hs;
    const auto n = static_cast<std::size_t>(B * T * row);
    const auto qkv = random_values<TestType>(rng, n, -2.0f, 2.0f);
    for (const bool backward : {false, true}) {
        INFO((backward ? "rope_backward" : "rope_forward"));
        auto qkv_d = to_device(tracker, qkv);
        std::vector<TestType> expected = qkv;
        if (backward) {
            rope_backward(dev, qkv_d.data(), qkv_d.data(), B, T, 2 * NHq, hs, 10000.0, 5, row);
            rope_backward(host, expected.data(), expected.data(), B, T, 2 * NHq, hs, 10000.0, 5, row);
        } else {
            rope_forward(dev, qkv_d.data(), qkv_d.data(), B, T, 2 * NHq, hs, 10000.0, 5, row);
            rope_forward(host, expected.data(), expected.data(), B, T, 2 * NHq, hs, 10000.0, 5, row);
        }
        const auto got = to_host(qkv_d);
        check_close(got, expected, tolerance<TestType>(), "qkv");
        std::vector<TestType> v_got, v_before;
        for (std::int64_t r = 0; r < B * T; ++r)
            for (std::int64_t j = 2 * NHq * hs; j < row; ++j) {
                v_got.push_back(got[static_cast<std::size_t>(r * row + j)]);
                v_before.push_back(qkv[static_cast<std::size_t>(r * row + j)]);
            }
        check_same_bits(v_got, v_before, "v");
    }
}

TEST_CASE("cuda llama kernels reject bad arguments before launching, naming the problem",
          "[cuda][rmsnorm][swiglu][rope]") {
    const Cuda dev{};
    float* f = nullptr;
    CHECK_THROWS_WITH(snug::cuda::rmsnorm_forward(dev, f, f, f, f, 4, 0),
                      Contains("rmsnorm_forward") && Contains("C = 0"));
    CHECK_THROWS_AS(snug::cuda::rmsnorm_forward(dev, f, f, f, f, 4, 8, -1.0), snug::ConfigError);
    CHECK_THROWS_AS(snug::cuda::rmsnorm_backward(dev, f, f, f, f, f, f, -1, 8), snug::ShapeError);
    CHECK_THROWS_WITH(snug::cuda::swiglu_forward(dev, f, f, 2, -3),
                      Contains("swiglu_forward") && Contains("H = -3"));
    CHECK_THROWS_AS(snug::cuda::swiglu_backward(dev, f, f, f, -2, 3), snug::ShapeError);
    CHECK_THROWS_WITH(snug::cuda::rope_forward(dev, f, f, 1, 4, 2, 9),
                      Contains("rope_forward") && Contains("hs = 9 is odd"));
    CHECK_THROWS_AS(snug::cuda::rope_backward(dev, f, f, 1, 4, 2, 8, -10000.0), snug::ConfigError);
    CHECK_THROWS_WITH(snug::cuda::rope_forward(dev, f, f, 1, 4, 2, 8, 10000.0, 0, 15),
                      Contains("rope_forward") && Contains("row_stride = 15"));
    // Nothing to do: nothing launched.
    snug::cuda::rmsnorm_forward(dev, f, f, f, f, 0, 8);
    snug::cuda::swiglu_forward(dev, f, f, 0, 8);
    snug::cuda::rope_forward(dev, f, f, 0, 4, 2, 8);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
}
