// TrainStep on CUDA: every combination of the three policies compiles and
// trains a small GPT with falling loss; checkpointed and plain runs give the
// same gradients (within rounding). Runs only where a GPU exists.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "snug/cuda/blas.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/snug.hpp"
#include "support/cuda_run.hpp"
#include "snug/train/train_step.hpp"

using snug::Cuda;
using snug::GPTConfig;
using snug::MemoryCategory;
using snug::test::CudaRun;
using snug::MicroBatch;

namespace {

GPTConfig config() {
    GPTConfig c;
    c.vocab_size = 64;
    c.padded_vocab_size = 64;
    c.max_seq_len = 16;
    c.n_layer = 2;
    c.n_head = 2;
    c.channels = 64;
    return c;
}

// Tokens and targets (a learnable pattern) for `n` positions, on the device.
struct DeviceTokens {
    snug::Buffer<std::int32_t, Cuda> tokens, targets;
    DeviceTokens(snug::MemoryTracker& tracker, int n, std::uint64_t seed)
        : tokens(tracker, MemoryCategory::temporaries, static_cast<std::size_t>(n), "tokens"),
          targets(tracker, MemoryCategory::temporaries, static_cast<std::size_t>(n), "targets") {
        snug::Generator g(seed);
        std::vector<std::int32_t> t(static_cast<std::size_t>(n)), y(t.size());
        for (std::size_t i = 0; i < t.size(); ++i) {
            t[i] = static_cast<std::int32_t>(g.below(64));
            y[i] = (t[i] * 7 + 3) % 64;
        }
        snug::cuda::copy_to_device(tokens.data(), std::span<const std::int32_t>(t));
        snug::cuda::copy_to_device(targets.data(), std::span<const std::int32_t>(y));
    }
};

template <class Precision, class Accumulation, class Checkpoint>
void trains(Accumulation acc = {}, Checkpoint ck = {}) {
    using Act = typename Precision::compute_type;
    const GPTConfig c = config();
    CudaRun run;
    snug::GPT<Act, Cuda> model(c, run.tracker);
    const auto w0 = snug::gpt_initial_weights(c, 7);
    model.load_weights(run.ctx.device, w0);
    snug::TrainConfig tc;
    tc.adamw.weight_decay = 0.0f;
    snug::TrainStep<snug::GPT<Act, Cuda>, Precision, Accumulation, Checkpoint> step(model, run.tracker, run.ctx.device,
                                                                                    w0, tc, {}, acc, ck);
    const int micro = acc.steps(), B = 4 / micro, T = 16;
    DeviceTokens data(run.tracker, micro * B * T, 3);
    std::vector<MicroBatch> mbs;
    for (int m = 0; m < micro; ++m) mbs.push_back({data.tokens.data() + m * B * T, data.targets.data() + m * B * T});
    std::vector<float> losses;
    for (int s = 0; s < 15; ++s) {
        const auto r = step.step(run.ctx, mbs, B, T, 3e-3f);
        if (!r.skipped) losses.push_back(r.loss);
    }
    INFO(Precision::name << " / accumulation " << micro << " / checkpoint " << Checkpoint::name);
    REQUIRE(losses.size() >= 6);
    CHECK(losses.back() < 0.8f * losses.front());
}

template <class Precision, class Checkpoint>
void trains_both(Checkpoint ck = {}) {
    trains<Precision, snug::accumulate::None, Checkpoint>({}, ck);
    trains<Precision, snug::accumulate::Steps, Checkpoint>(snug::accumulate::Steps(2), ck);
}

template <class Precision>
void trains_every_checkpoint() {
    trains_both<Precision, snug::checkpoint::None>();
    trains_both<Precision, snug::checkpoint::Full>();
    trains_both<Precision, snug::checkpoint::EveryNth<2>>();
    trains_both<Precision, snug::checkpoint::Selective>();
    trains_both<Precision, snug::checkpoint::Budget>(snug::checkpoint::Budget(std::size_t{1} << 20));
}

}  // namespace

TEST_CASE("every policy combination trains on CUDA") {
    trains_every_checkpoint<snug::precision::Fp32>();
    trains_every_checkpoint<snug::precision::Bf16>();
    trains_every_checkpoint<snug::precision::Fp16<snug::DynamicLossScaler>>();
    trains_every_checkpoint<snug::precision::Fp16<snug::StaticLossScaler>>();
}

TEST_CASE("checkpointed and plain CUDA runs give the same gradients") {
    const GPTConfig c = config();
    auto grads_with = [&](snug::Recompute mode) {
        CudaRun run;
        snug::GPT<float, Cuda> model(c, run.tracker);
        model.load_weights(run.ctx.device, snug::gpt_initial_weights(c, 9));
        const std::vector<snug::Recompute> modes(2, mode);
        model.set_recompute(modes);
        model.zero_grad(run.ctx.device);
        DeviceTokens data(run.tracker, 3 * 16, 4);
        model.forward(run.ctx, data.tokens.data(), data.targets.data(), 3, 16, 1.0f / 48);
        model.backward(run.ctx, data.tokens.data());
        std::vector<float> g(static_cast<std::size_t>(model.num_parameters()));
        snug::cuda::copy_to_host(std::span<float>(g), model.gradients());
        CHECK(model.predict_activation_peak(3, 16, modes) == run.tracker.peak(MemoryCategory::activations));
        return g;
    };
    const auto plain = grads_with(snug::Recompute::none);
    for (snug::Recompute mode : {snug::Recompute::full, snug::Recompute::selective}) {
        const auto g = grads_with(mode);
        double max_abs = 0, max_ref = 0;
        for (std::size_t i = 0; i < g.size(); ++i) {
            max_abs = std::max(max_abs, double(std::abs(g[i] - plain[i])));
            max_ref = std::max(max_ref, double(std::abs(plain[i])));
        }
        INFO(snug::recompute_name(mode) << ": max abs difference " << max_abs << " of " << max_ref);
        CHECK(max_abs <= 1e-6 * max_ref);
    }
}
