// The chunked classifier (nn/classifier.hpp) on CUDA against the unchunked
// head on the host (the whole logits, softmax cross-entropy, the head's
// backward), fresh random hidden states, weights and targets, outputs
// poisoned first, for float, bfloat16 and half, chunks of 1, 7 (a remainder)
// and automatic: the loss within 1e-5 relative, d(hidden) within the backend
// tolerance (1e-5 fp32, 1e-2 16-bit, as check_close measures), the fp32 dW
// within 1e-5 (fp32) or 1e-4 (16-bit: its terms are rounded dlogits). Evaluation leaves the poisoned gradients alone; a
// running total on the device gains N times the loss. The
// last position's logits against the host's. Runs only where a GPU exists.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "snug/nn/classifier.hpp"
#include "snug/snug.hpp"
#include "support/cuda_run.hpp"
#include "support/cuda_support.hpp"
#include "support/host_run.hpp"

using namespace snug::test;

TEMPLATE_TEST_CASE("cuda chunked classifier matches the host's unchunked head", "[cuda][classifier]", float,
                   snug::bfloat16, snug::half) {
    using T = TestType;
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const std::int64_t N = 45;
    const int C = 32, V = 200, Vp = 256;
    const auto n = static_cast<std::size_t>(N);
    const auto x = random_values<T>(rng, n * C, -1.0f, 1.0f);
    const auto w = random_values<T>(rng, std::size_t{Vp} * C, -0.5f, 0.5f);
    const auto dw0 = random_values<float>(rng, std::size_t{Vp} * C, -0.1f, 0.1f);
    std::vector<std::int32_t> targets(n);
    for (auto& t : targets) t = static_cast<std::int32_t>(rng.below(V));
    const float dloss = 1.0f / static_cast<float>(N);
    // dW is fp32, but for 16-bit T it sums dlogits rounded to T on each side:
    // where host and device straddle a rounding boundary (their logits come
    // from GEMMs summed in different orders), a term differs by one ulp of T
    // (2^-8 of a dlogit of about 1e-4 here, against dW's rms of 0.06). Up to
    // N = 45 such terms could bound it at 3e-4; the worst seen was 1.5e-5
    // (seed 11777420197372672403), past fp32's 1e-5.
    const double dw_tolerance = std::is_same_v<T, float> ? 1e-5 : 1e-4;

    // The host, unchunked.
    const snug::Host host;
    std::vector<T> logits(n * Vp), dx_ref(n * C);
    std::vector<float> losses(n), dw_ref = dw0;
    linear_forward(host, logits.data(), x.data(), w.data(), static_cast<const T*>(nullptr), N, C, Vp);
    softmax_cross_entropy(host, losses.data(), logits.data(), targets.data(), N, V, Vp, dloss);
    linear_backward(host, dx_ref.data(), dw_ref.data(), static_cast<float*>(nullptr), logits.data(), x.data(),
                    w.data(), N, C, Vp);
    double sum = 0.0;
    for (float l : losses) sum += l;
    const double loss_ref = sum / static_cast<double>(N);

    for (const std::int64_t chunk : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}}) {
        INFO("chunk " << chunk);
        CudaRun run;
        auto x_d = to_device(run.tracker, x);
        auto w_d = to_device(run.tracker, w);
        auto t_d = to_device(run.tracker, targets);
        auto dw_d = to_device(run.tracker, dw0);
        auto dx_d = poisoned<T>(run.tracker, n * C);
        const float loss = snug::classifier_loss(run.ctx, dx_d.data(), dw_d.data(), x_d.data(), w_d.data(),
                                                 t_d.data(), N, C, V, Vp, dloss, chunk);
        CHECK(std::abs(loss - loss_ref) <= 1e-5 * loss_ref);
        check_close(to_host(dx_d), dx_ref, tolerance<T>(), "d hidden");
        check_close(to_host(dw_d), dw_ref, dw_tolerance, "dW");

        // Evaluation: the same loss; the gradients it was given stay poisoned.
        auto dx_eval = poisoned<T>(run.tracker, n * C);
        const float eval = snug::classifier_loss(run.ctx, static_cast<T*>(nullptr), static_cast<float*>(nullptr),
                                                 x_d.data(), w_d.data(), t_d.data(), N, C, V, Vp, 0.0f, chunk);
        CHECK(std::abs(eval - loss_ref) <= 1e-5 * loss_ref);
        for (const T& v : to_host(dx_eval)) REQUIRE(std::isnan(static_cast<float>(v)));

        // Evaluation into a running total on the device: N times the loss added, NaN returned.
        auto total_d = to_device(run.tracker, std::vector<double>{2.0});
        const float none = snug::classifier_loss(run.ctx, static_cast<T*>(nullptr), static_cast<float*>(nullptr),
                                                 x_d.data(), w_d.data(), t_d.data(), N, C, V, Vp, 0.0f, chunk,
                                                 total_d.data());
        CHECK(std::isnan(none));
        CHECK(std::abs((to_host(total_d)[0] - 2.0) / static_cast<double>(N) - loss_ref) <= 1e-5 * loss_ref);
    }

    // Sampling: the last position of each of 3 sequences of 15.
    CudaRun run;
    auto x_d = to_device(run.tracker, x);
    auto w_d = to_device(run.tracker, w);
    auto last_d = poisoned<T>(run.tracker, std::size_t{3} * Vp);
    snug::last_position_logits(run.ctx.device, last_d.data(), x_d.data(), w_d.data(), 3, 15, C, Vp);
    std::vector<T> last_ref(std::size_t{3} * Vp);
    std::vector<T> all(n * Vp);
    linear_forward(host, all.data(), x.data(), w.data(), static_cast<const T*>(nullptr), N, C, Vp);
    for (int b = 0; b < 3; ++b)
        for (int v = 0; v < Vp; ++v)
            last_ref[static_cast<std::size_t>(b * Vp + v)] = all[static_cast<std::size_t>((b * 15 + 14) * Vp + v)];
    check_close(to_host(last_d), last_ref, tolerance<T>(), "last logits");
}
