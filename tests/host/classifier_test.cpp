// The chunked classifier (nn/classifier.hpp): the automatic chunk size by
// hand; losses and gradients against the unchunked head (the whole logits
// GEMM, softmax cross-entropy, the head's backward) for chunks that divide N,
// leave a remainder, hold one row or all of them, in double, fp32 and bf16;
// evaluation leaves the gradients alone; the scratch it uses, byte for byte;
// bad targets change nothing; the last position's logits.
#include "snug/nn/classifier.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "support/host_run.hpp"

namespace {

using snug::MemoryCategory;

std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

template <class T>
double to_d(T x) {
    if constexpr (std::is_same_v<T, double>) {
        return x;
    } else {
        return static_cast<float>(x);
    }
}

template <class T>
std::vector<T> uniform(std::size_t n, double scale, std::mt19937& rng) {
    std::uniform_real_distribution<double> d(-scale, scale);
    std::vector<T> v(n);
    for (auto& x : v) x = T(static_cast<float>(d(rng)));
    return v;
}

// The unchunked head: logits (N, Vp) whole, their loss and gradient, then the
// head's backward over all N rows at once.
template <class T>
float unchunked(snug::test::HostRun& run, std::vector<T>& dx, std::vector<float>& dw, const std::vector<T>& x,
                const std::vector<T>& w, const std::vector<std::int32_t>& targets, std::int64_t N, int C, int V,
                int Vp, float dloss) {
    std::vector<T> logits(at(N * Vp));
    std::vector<float> losses(at(N));
    linear_forward(run.ctx.device, logits.data(), x.data(), w.data(), static_cast<const T*>(nullptr), N, C, Vp);
    softmax_cross_entropy(run.ctx.device, losses.data(), logits.data(), targets.data(), N, V, Vp, dloss);
    linear_backward(run.ctx.device, dx.data(), dw.data(), static_cast<float*>(nullptr), logits.data(), x.data(),
                          w.data(), N, C, Vp);
    double sum = 0.0;
    for (float l : losses) sum += l;
    return static_cast<float>(sum / static_cast<double>(N));
}

template <class T>
void compare_with_unchunked(double loss_tol, double dx_tol, double dw_tol) {
    std::mt19937 rng(17);
    const std::int64_t N = 37;
    const int C = 24, V = 61, Vp = 64;
    const auto x = uniform<T>(at(N * C), 1.0, rng), w = uniform<T>(at(std::int64_t{Vp} * C), 0.5, rng);
    std::vector<std::int32_t> targets(at(N));
    for (auto& t : targets) t = static_cast<std::int32_t>(rng() % V);
    const float dloss = 1.0f / static_cast<float>(N);
    const std::vector<float> dw0 = uniform<float>(at(std::int64_t{Vp} * C), 0.1, rng);  // gradients accumulate

    snug::test::HostRun ref_run;
    std::vector<T> dx_ref(at(N * C));
    std::vector<float> dw_ref = dw0;
    const float loss_ref = unchunked(ref_run, dx_ref, dw_ref, x, w, targets, N, C, V, Vp, dloss);

    for (const std::int64_t chunk : {std::int64_t{0}, std::int64_t{1}, std::int64_t{5}, std::int64_t{8},
                                     std::int64_t{37}, std::int64_t{100}}) {
        INFO("chunk " << chunk);
        snug::test::HostRun run;
        std::vector<T> dx(at(N * C), T(std::nanf("")));
        std::vector<float> dw = dw0;
        const float loss = snug::classifier_loss(run.ctx, dx.data(), dw.data(), x.data(), w.data(), targets.data(), N,
                                                 C, V, Vp, dloss, chunk);
        CHECK(std::abs(loss - loss_ref) <= loss_tol * std::abs(loss_ref));
        double dx_scale = 0.0, dw_scale = 0.0, dx_err = 0.0, dw_err = 0.0;
        for (std::size_t i = 0; i < dx.size(); ++i) {
            dx_scale = std::max(dx_scale, std::abs(to_d(dx_ref[i])));
            dx_err = std::max(dx_err, std::abs(to_d(dx[i]) - to_d(dx_ref[i])));
        }
        for (std::size_t i = 0; i < dw.size(); ++i) {
            dw_scale = std::max(dw_scale, std::abs(static_cast<double>(dw_ref[i] - dw0[i])));
            dw_err = std::max(dw_err, std::abs(static_cast<double>(dw[i]) - static_cast<double>(dw_ref[i])));
        }
        CHECK(dx_scale > 0.0);
        CHECK(dx_err <= dx_tol * dx_scale);  // NaN poison left anywhere fails here
        CHECK(dw_err <= dw_tol * dw_scale);
        CHECK(run.tracker.current(MemoryCategory::temporaries) == 0);
        // With a running total: the same pass adds N times its loss there and
        // returns NaN (nothing read back).
        double total = 3.0;
        std::vector<T> dx2(at(N * C));
        std::vector<float> dw2 = dw0;
        const float none = snug::classifier_loss(run.ctx, dx2.data(), dw2.data(), x.data(), w.data(), targets.data(),
                                                 N, C, V, Vp, dloss, chunk, &total);
        CHECK(std::isnan(none));
        CHECK(std::abs(static_cast<float>((total - 3.0) / static_cast<double>(N)) - loss_ref) <= loss_tol * std::abs(loss_ref));
        CHECK(dw2 == dw);
    }
}

TEST_CASE("the automatic chunk: a chunk's logits at least the hidden states, a power of two of rows, >= 128") {
    // GPT-2 124M at B 16, T 1024: Vp / C = 50304 / 768 = 65.5, 66 rows of
    // hidden values per logit row; 16384 / 66 = 248.2 -> 256 rows.
    CHECK(snug::classifier_chunk_rows(16384, 768, 50304, 0) == 256);
    CHECK(snug::classifier_chunk_rows(4096, 64, 8192, 0) == 128);   // 4096 / 128 = 32, but at least 128
    CHECK(snug::classifier_chunk_rows(100000, 64, 256, 0) == 32768);  // 256 / 64 = 4; 25000 -> 2^15
    CHECK(snug::classifier_chunk_rows(18, 24, 64, 0) == 18);         // at most N
    CHECK(snug::classifier_chunk_rows(18, 24, 64, 5) == 5);          // asked
    CHECK(snug::classifier_chunk_rows(18, 24, 64, 100) == 18);       // at most N
    CHECK(snug::classifier_chunk_rows(0, 24, 64, 0) == 0);
    CHECK_THROWS_WITH(snug::classifier_chunk_rows(18, 24, 64, -1), Catch::Contains("-1 rows"));
}

TEST_CASE("a chunked head gives the unchunked head's loss and gradients") {
    // The loss and d(hidden) are row by row, the same in any chunking (but for
    // the GEMM's blocking); dW adds its rows chunk by chunk into the fp32
    // gradient (fp32 even for double activations), so it differs by rounding.
    SECTION("double") { compare_with_unchunked<double>(1e-14, 1e-13, 1e-6); }
    SECTION("float") { compare_with_unchunked<float>(1e-6, 1e-6, 1e-5); }
    SECTION("bfloat16") { compare_with_unchunked<snug::bfloat16>(1e-6, 1e-2, 1e-5); }
}

TEST_CASE("evaluation: the loss alone, no gradient touched, one chunk of logits in scratch") {
    std::mt19937 rng(3);
    const std::int64_t N = 300;
    const int C = 16, V = 100, Vp = 128;
    const auto x = uniform<float>(at(N * C), 1.0, rng), w = uniform<float>(at(std::int64_t{Vp} * C), 0.5, rng);
    std::vector<std::int32_t> targets(at(N));
    for (auto& t : targets) t = static_cast<std::int32_t>(rng() % V);
    snug::test::HostRun ref_run;
    std::vector<float> dx_unused(at(N * C)), dw_unused(at(std::int64_t{Vp} * C));
    const float loss_ref = unchunked(ref_run, dx_unused, dw_unused, x, w, targets, N, C, V, Vp, 0.0f);

    snug::test::HostRun run;
    const float loss =
        snug::classifier_loss<float>(run.ctx, nullptr, nullptr, x.data(), w.data(), targets.data(), N, C, V, Vp, 0.0f, 0);
    CHECK(std::abs(loss - loss_ref) <= 1e-6 * std::abs(loss_ref));
    // Automatic chunk: 128 / 16 = 8; 300 / 8 = 37.5 -> 64, at least 128 rows.
    // Scratch at its peak: the per-token losses (4 N) and 128 rows of fp32
    // logits (128 Vp 4), not the 300 Vp 4 = 153600 bytes of the whole logits.
    CHECK(run.tracker.peak(MemoryCategory::temporaries) == 4 * 300 + 128 * 128 * 4);
    CHECK(run.tracker.current(MemoryCategory::temporaries) == 0);
}

TEST_CASE("a target outside the vocabulary names itself and changes nothing") {
    std::mt19937 rng(5);
    const std::int64_t N = 12;
    const int C = 8, V = 30, Vp = 32;
    const auto x = uniform<float>(at(N * C), 1.0, rng), w = uniform<float>(at(std::int64_t{Vp} * C), 0.5, rng);
    std::vector<std::int32_t> targets(at(N), 3);
    targets[9] = V;  // the first bad one, in the third chunk of 4
    std::vector<float> dx(at(N * C), 7.0f), dw(at(std::int64_t{Vp} * C), 2.0f);
    snug::test::HostRun run;
    CHECK_THROWS_WITH(snug::classifier_loss(run.ctx, dx.data(), dw.data(), x.data(), w.data(), targets.data(), N, C,
                                            V, Vp, 1.0f, 4),
                      Catch::Contains("target id 30 in row 9"));
    for (float v : dx) REQUIRE(v == 7.0f);
    for (float v : dw) REQUIRE(v == 2.0f);
    CHECK(run.tracker.current(MemoryCategory::temporaries) == 0);
    CHECK_THROWS_WITH(snug::classifier_loss(run.ctx, static_cast<float*>(nullptr), dw.data(), x.data(), w.data(),
                                            targets.data(), N, C, V, Vp, 1.0f, 0),
                      Catch::Contains("null"));
}

TEST_CASE("the last position's logits are the whole logits' last rows") {
    std::mt19937 rng(9);
    const int B = 3, T = 5, C = 16, Vp = 40;
    const auto x = uniform<double>(at(std::int64_t{B} * T * C), 1.0, rng);
    const auto w = uniform<double>(at(std::int64_t{Vp} * C), 0.5, rng);
    std::vector<double> all(at(std::int64_t{B} * T * Vp)), last(at(std::int64_t{B} * Vp), std::nan(""));
    const snug::Host dev;
    linear_forward(dev, all.data(), x.data(), w.data(), static_cast<const double*>(nullptr), B * T, C, Vp);
    snug::last_position_logits(dev, last.data(), x.data(), w.data(), B, T, C, Vp);
    for (int b = 0; b < B; ++b)
        for (int v = 0; v < Vp; ++v)
            CHECK(last[at(std::int64_t{b} * Vp + v)] == all[at((std::int64_t{b} * T + T - 1) * Vp + v)]);
}

}  // namespace
