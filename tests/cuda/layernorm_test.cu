// The CUDA LayerNorm against the host kernel on fresh random inputs, outputs
// poisoned first: forward (out, and the fp32 mean and rstd), backward (dinp,
// dweight and dbias all accumulate, so they start from random values), for
// float, bfloat16 and half. Tolerances (DESIGN.md): the statistics and the fp32
// parameter gradients within 1e-5 for every T, activations within 1e-5 (fp32)
// or 1e-2 (16-bit), relative to |host| + rms(host). Sizes cover C = 1, C not a
// multiple of 32, C > 1024, one row and many, and both the 16-byte vector
// path (C a multiple of 4 floats or 8 16-bit values: 8, 100 for fp32, 768,
// 1000 — 125 vectors, not a multiple of the warp — and GPT-2 1558M's 1600) and
// one value at a time (odd C).
// The backward is one launch (norm_rows.cuh): each block's partial sums of
// dweight and dbias, added by the last block to finish. Sizes give it many
// blocks (4099 rows), fewer rows than the emulated GPU has SMs (100; 1), and
// channels in two slices (C = 30000 vectorised, 30011 one at a time). Each
// case runs the backward twice on the same gradients, as two micro-batches
// accumulate: dinp, dweight and dbias must hold both (+=), the second launch
// finds the ticket counter back at 0, and leaves it there. With and without a
// Blas on the device tag (partial sums in its workspace, or in pool memory)
// the bits are the same, and the backward gives the same bits on every run.
// residual_layernorm_forward gives exactly the bits of the two kernels it
// fuses (add_inplace, layernorm_forward) and is within the tolerances above
// of its host twin.
// Runs only where a GPU exists.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/cuda/layernorm.cuh"
#include "snug/host/layernorm.hpp"
#include "snug/snug.hpp"
#include "support/cuda_support.hpp"

using Catch::Matchers::Contains;
using snug::Cuda;
using snug::MemoryCategory;
using snug::MemoryTracker;
using namespace snug::test;

namespace {

template <class T>
void check_layernorm(snug::Generator& rng, std::int64_t N, int C) {
    INFO("N = " << N << ", C = " << C);
    MemoryTracker tracker;
    const snug::Host host;
    snug::cuda::Blas blas(tracker);
    Cuda dev{};  // partial sums in memory from the stream's pool
    Cuda dev_blas{};
    dev_blas.blas = &blas;  // partial sums in the Blas workspace
    const auto n = static_cast<std::size_t>(N) * static_cast<std::size_t>(C);
    const auto rows = static_cast<std::size_t>(N);
    const auto inp = random_values<T>(rng, n, -2.0f, 3.0f);  // rows with a mean to remove
    const auto weight = random_values<T>(rng, static_cast<std::size_t>(C), 0.5f, 1.5f);
    const auto bias = random_values<T>(rng, static_cast<std::size_t>(C), -0.5f, 0.5f);
    const auto dout = random_values<T>(rng, n, -1.0f, 1.0f);
    const auto dinp0 = random_values<T>(rng, n, -1.0f, 1.0f);
    const auto dweight0 = random_values<float>(rng, static_cast<std::size_t>(C), -1.0f, 1.0f);
    const auto dbias0 = random_values<float>(rng, static_cast<std::size_t>(C), -1.0f, 1.0f);

    auto inp_d = to_device(tracker, inp);
    auto weight_d = to_device(tracker, weight);
    auto bias_d = to_device(tracker, bias);
    auto out_d = poisoned<T>(tracker, n);
    auto mean_d = poisoned<float>(tracker, rows);
    auto rstd_d = poisoned<float>(tracker, rows);
    layernorm_forward(dev, out_d.data(), mean_d.data(), rstd_d.data(), inp_d.data(), weight_d.data(), bias_d.data(),
                      N, C);
    std::vector<T> out(n);
    std::vector<float> mean(rows), rstd(rows);
    layernorm_forward(host, out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    check_close(to_host(out_d), out, tolerance<T>(), "out");
    check_close(to_host(mean_d), mean, 1e-5, "mean");
    check_close(to_host(rstd_d), rstd, 1e-5, "rstd");

    // The backward from the host's statistics, on both sides, twice over the
    // same gradients (two micro-batches' worth).
    auto host_mean_d = to_device(tracker, mean);
    auto host_rstd_d = to_device(tracker, rstd);
    auto dout_d = to_device(tracker, dout);
    std::vector<T> dinp = dinp0;
    std::vector<float> dweight = dweight0, dbias = dbias0;
    auto dinp_d = to_device(tracker, dinp0);
    auto dweight_d = to_device(tracker, dweight0);
    auto dbias_d = to_device(tracker, dbias0);
    for (int pass = 1; pass <= 2; ++pass) {
        INFO("backward pass " << pass);
        layernorm_backward(dev_blas, dinp_d.data(), dweight_d.data(), dbias_d.data(), dout_d.data(), inp_d.data(),
                           weight_d.data(), host_mean_d.data(), host_rstd_d.data(), N, C);
        layernorm_backward(host, dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(),
                           mean.data(), rstd.data(), N, C);
        check_close(to_host(dinp_d), dinp, tolerance<T>(), "dinp");
        check_close(to_host(dweight_d), dweight, 1e-5, "dweight");
        check_close(to_host(dbias_d), dbias, 1e-5, "dbias");
        unsigned ticket = 1;
        snug::cuda::copy_to_host(&ticket, blas.ticket_counter(), 1);
        CHECK(ticket == 0);  // the last block put it back
    }

    // Without a Blas: the same launch, the same bits.
    auto dinp2_d = to_device(tracker, dinp0);
    auto dweight2_d = to_device(tracker, dweight0);
    auto dbias2_d = to_device(tracker, dbias0);
    for (int pass = 1; pass <= 2; ++pass)
        layernorm_backward(dev, dinp2_d.data(), dweight2_d.data(), dbias2_d.data(), dout_d.data(), inp_d.data(),
                           weight_d.data(), host_mean_d.data(), host_rstd_d.data(), N, C);
    check_same_bits(to_host(dinp2_d), to_host(dinp_d), "dinp without a Blas");
    check_same_bits(to_host(dweight2_d), to_host(dweight_d), "dweight without a Blas");
    check_same_bits(to_host(dbias2_d), to_host(dbias_d), "dbias without a Blas");
}

}  // namespace

TEMPLATE_TEST_CASE("cuda layernorm forward and backward match the host", "[cuda][layernorm]", float, snug::bfloat16,
                   snug::half) {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const std::pair<std::int64_t, int> sizes[] = {{1, 1},    {3, 1},    {1, 37},    {7, 100},  {64, 768},
                                                   {1000, 33}, {5, 1601}, {2, 8},     {9, 1000}, {4099, 64},
                                                   {100, 40},  {1, 768},  {33, 1600}, {3, 30000}, {2, 30011}};
    for (const auto& [N, C] : sizes) check_layernorm<TestType>(rng, N, C);
}

// The launch shape, by the rules in norm_rows.cuh's comment, for an sm_90
// GPU of 132 SMs (227 KiB of shared memory per block) and for sm_86's 99 KiB.
TEST_CASE("cuda norm backward: one block per SM, as many warps as shared memory holds sums for",
          "[cuda][layernorm][rmsnorm]") {
    using snug::cuda::detail::norm_backward_shape;
    constexpr std::size_t sm90 = 227 * 1024, sm86 = 99 * 1024;
    // GPT-2 124M, bf16, LayerNorm (2 sums per channel): 32 warps of 768 x 8 bytes.
    auto s = norm_backward_shape(16384, 768, 2, 8, 132, sm90, 1 << 20);
    CHECK(s.blocks == 132);
    CHECK(s.warps == 32);
    CHECK(s.slice == 768);
    CHECK(s.shared_bytes == 32 * 768 * 8);
    CHECK(norm_backward_shape(16384, 768, 2, 8, 82, sm86, 1 << 20).warps == 16);  // 101376 / 6144
    // GPT-2 1558M's C = 1600: 232448 / 12800 = 18 warps; a 1B Llama's RMSNorm
    // (1 sum per channel) at C = 2048: 232448 / 8192 = 28.
    CHECK(norm_backward_shape(16384, 1600, 2, 8, 132, sm90, 1 << 20).warps == 18);
    CHECK(norm_backward_shape(16384, 2048, 1, 8, 132, sm90, 1 << 20).warps == 28);
    // Few rows: no block without a row for each warp's first.
    CHECK(norm_backward_shape(1, 768, 2, 8, 132, sm90, 1 << 20).blocks == 1);
    CHECK(norm_backward_shape(100, 768, 2, 8, 132, sm90, 1 << 20).blocks == 4);  // 100 rows / 32 warps
    // The scratch bounds the partial rows.
    CHECK(norm_backward_shape(16384, 768, 2, 8, 132, sm90, 40).blocks == 40);
    // Past one warp's 29056 channels (with a bias): one warp, slices of a multiple of 32 W.
    s = norm_backward_shape(10, 30000, 2, 8, 132, sm90, 1 << 20);
    CHECK(s.warps == 1);
    CHECK(s.slice == 28928);  // 113 x 256
    CHECK(s.blocks == 10);
    s = norm_backward_shape(10, 30011, 2, 1, 132, sm90, 1 << 20);
    CHECK(s.slice == 29056);  // 908 x 32
    CHECK(s.shared_bytes == 29056 * 8);
}

TEMPLATE_TEST_CASE("cuda residual_layernorm_forward: the bits of add_inplace then layernorm_forward, near the host's",
                   "[cuda][layernorm]", float, snug::bfloat16, snug::half) {
    using T = TestType;
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const snug::Host host;
    const Cuda dev{};
    const std::pair<std::int64_t, int> sizes[] = {{3, 37}, {64, 768}, {9, 1000}, {1, 8}};
    for (const auto& [N, C] : sizes) {
        INFO("N = " << N << ", C = " << C);
        MemoryTracker tracker;
        const auto n = static_cast<std::size_t>(N) * static_cast<std::size_t>(C);
        const auto rows = static_cast<std::size_t>(N);
        const auto res = random_values<T>(rng, n, -2.0f, 3.0f);
        const auto x = random_values<T>(rng, n, -1.0f, 1.0f);
        const auto weight = random_values<T>(rng, static_cast<std::size_t>(C), 0.5f, 1.5f);
        const auto bias = random_values<T>(rng, static_cast<std::size_t>(C), -0.5f, 0.5f);
        auto x_d = to_device(tracker, x);
        auto weight_d = to_device(tracker, weight);
        auto bias_d = to_device(tracker, bias);

        auto res_d = to_device(tracker, res);
        auto out_d = poisoned<T>(tracker, n);
        auto mean_d = poisoned<float>(tracker, rows);
        auto rstd_d = poisoned<float>(tracker, rows);
        snug::cuda::residual_layernorm_forward(dev, out_d.data(), mean_d.data(), rstd_d.data(), res_d.data(),
                                               x_d.data(), weight_d.data(), bias_d.data(), N, C);
        // The two kernels it fuses.
        auto res2_d = to_device(tracker, res);
        auto out2_d = poisoned<T>(tracker, n);
        auto mean2_d = poisoned<float>(tracker, rows);
        auto rstd2_d = poisoned<float>(tracker, rows);
        snug::cuda::add_inplace(dev, res2_d.data(), x_d.data(), std::int64_t(n));
        snug::cuda::layernorm_forward(dev, out2_d.data(), mean2_d.data(), rstd2_d.data(), res2_d.data(),
                                      weight_d.data(), bias_d.data(), N, C);
        check_same_bits(to_host(res_d), to_host(res2_d), "res");
        check_same_bits(to_host(out_d), to_host(out2_d), "out");
        check_same_bits(to_host(mean_d), to_host(mean2_d), "mean");
        check_same_bits(to_host(rstd_d), to_host(rstd2_d), "rstd");
        // And the host twin.
        std::vector<T> res_h = res, out_h(n);
        std::vector<float> mean_h(rows), rstd_h(rows);
        snug::host::residual_layernorm_forward(host, out_h.data(), mean_h.data(), rstd_h.data(), res_h.data(),
                                               x.data(), weight.data(), bias.data(), N, C);
        check_same_bits(to_host(res_d), res_h, "res (host)");  // one rounding of an fp32 sum on both
        check_close(to_host(out_d), out_h, tolerance<T>(), "out (host)");
        check_close(to_host(mean_d), mean_h, 1e-5, "mean (host)");
        check_close(to_host(rstd_d), rstd_h, 1e-5, "rstd (host)");
    }
    float* f = nullptr;
    CHECK_THROWS_WITH(snug::cuda::residual_layernorm_forward(dev, f, f, f, f, f, f, f, 4, 0),
                      Contains("residual_layernorm_forward") && Contains("C = 0"));
}

TEMPLATE_TEST_CASE("cuda layernorm backward is deterministic, on a stream of its own", "[cuda][layernorm]", float,
                   snug::bfloat16) {
    using T = TestType;
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    MemoryTracker tracker;
    snug::cuda::Blas blas(tracker);
    cudaStream_t stream = nullptr;
    snug::cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    Cuda dev{stream};
    dev.blas = &blas;  // 129 blocks of 32 rows at a time, then the last block's sum
    const std::int64_t N = 4099;
    const int C = 768;
    const auto n = static_cast<std::size_t>(N) * C;
    auto inp_d = to_device(tracker, random_values<T>(rng, n, -2.0f, 3.0f));
    auto weight_d = to_device(tracker, random_values<T>(rng, C, 0.5f, 1.5f));
    auto bias_d = to_device(tracker, random_values<T>(rng, C, -0.5f, 0.5f));
    auto dout_d = to_device(tracker, random_values<T>(rng, n, -1.0f, 1.0f));
    const auto dinp0 = random_values<T>(rng, n, -1.0f, 1.0f);
    const auto dweight0 = random_values<float>(rng, C, -1.0f, 1.0f);
    auto out_d = poisoned<T>(tracker, n);
    auto mean_d = poisoned<float>(tracker, static_cast<std::size_t>(N));
    auto rstd_d = poisoned<float>(tracker, static_cast<std::size_t>(N));
    layernorm_forward(dev, out_d.data(), mean_d.data(), rstd_d.data(), inp_d.data(), weight_d.data(), bias_d.data(),
                      N, C);
    std::vector<T> first_dinp;
    std::vector<float> first_dweight, first_dbias;
    for (int run = 0; run < 3; ++run) {
        auto dinp_d = to_device(tracker, dinp0);
        auto dweight_d = to_device(tracker, dweight0);
        auto dbias_d = to_device(tracker, dweight0);
        layernorm_backward(dev, dinp_d.data(), dweight_d.data(), dbias_d.data(), dout_d.data(), inp_d.data(),
                           weight_d.data(), mean_d.data(), rstd_d.data(), N, C);
        dev.synchronize();  // the copies below run on the default stream, which does not wait for this one
        if (run == 0) {
            first_dinp = to_host(dinp_d);
            first_dweight = to_host(dweight_d);
            first_dbias = to_host(dbias_d);
        } else {
            const std::string tag = ", run " + std::to_string(run);
            check_same_bits(to_host(dinp_d), first_dinp, "dinp" + tag);
            check_same_bits(to_host(dweight_d), first_dweight, "dweight" + tag);
            check_same_bits(to_host(dbias_d), first_dbias, "dbias" + tag);
        }
    }
    snug::cuda::check(cudaStreamDestroy(stream));
}

TEST_CASE("cuda layernorm rejects bad sizes before launching", "[cuda][layernorm]") {
    const Cuda dev{};
    float* f = nullptr;
    CHECK_THROWS_WITH(snug::cuda::layernorm_forward(dev, f, f, f, f, f, f, -2, 8),
                      Contains("layernorm_forward") && Contains("N = -2"));
    CHECK_THROWS_WITH(snug::cuda::layernorm_backward(dev, f, f, f, f, f, f, f, f, 4, 0), Contains("C = 0"));
    CHECK_THROWS_AS(snug::cuda::layernorm_backward(dev, f, f, f, f, f, f, f, f, 4, -1), snug::ShapeError);
    snug::cuda::layernorm_forward(dev, f, f, f, f, f, f, 0, 8);  // no rows: nothing to launch
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
}
