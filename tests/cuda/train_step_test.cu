// TrainStep on CUDA against TrainStep on the host: for every combination of
// the three policies, three updates from the same weights on the same tokens
// give the same losses, the same skip decisions, and first-update gradients
// within the precision's tolerance; checkpointed and plain CUDA runs give the
// same gradients (within rounding); an optimizer offloaded to the host gives
// the device optimizer's bits and keeps no state on the device. Runs emulated
// everywhere, and on a GPU where one exists.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/cuda/blas.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/snug.hpp"
#include "snug/train/train_step.hpp"
#include "support/cuda_run.hpp"
#include "support/host_run.hpp"

using snug::Cuda;
using snug::GPTConfig;
using snug::Host;
using snug::MemoryCategory;
using snug::MicroBatch;
using snug::test::CudaRun;
using snug::test::HostRun;

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

// Tokens and targets (a learnable pattern) for `n` positions.
struct Tokens {
    std::vector<std::int32_t> tokens, targets;
    Tokens(int n, std::uint64_t seed) : tokens(static_cast<std::size_t>(n)), targets(tokens.size()) {
        snug::Generator g(seed);
        for (std::size_t i = 0; i < tokens.size(); ++i) {
            tokens[i] = static_cast<std::int32_t>(g.below(64));
            targets[i] = (tokens[i] * 7 + 3) % 64;
        }
    }
};

// The same tokens in device memory.
struct DeviceTokens {
    snug::Buffer<std::int32_t, Cuda> tokens, targets;
    DeviceTokens(snug::MemoryTracker& tracker, const Tokens& t)
        : tokens(tracker, MemoryCategory::temporaries, t.tokens.size(), "tokens"),
          targets(tracker, MemoryCategory::temporaries, t.targets.size(), "targets") {
        snug::cuda::copy_to_device(tokens.data(), std::span<const std::int32_t>(t.tokens));
        snug::cuda::copy_to_device(targets.data(), std::span<const std::int32_t>(t.targets));
    }
};

// What a few updates did: every update's loss and skip, and the gradients
// (unscaled, fp32) and gradient norm of the first one.
struct Trace {
    std::vector<float> losses;
    std::vector<bool> skipped;
    std::vector<float> first_grads;
    float first_norm = 0.0f;
    std::vector<unsigned char> final_weights;  // the working weights' bytes after the last update
    std::size_t device_state = 0;              // peak device bytes of master weights + optimizer state
    std::size_t host_state = 0;                // peak host bytes of an offloaded optimizer
    std::int64_t parameters = 0;
    std::int64_t largest_group = 0;
};

// The optimizer's storage (the lean variants round stochastically, from the
// same stream on both backends).
struct Storage {
    snug::MomentStorage moments = snug::MomentStorage::fp32;
    snug::MasterStorage master = snug::MasterStorage::fp32;
    bool offload = false;
    std::int64_t offload_chunk = std::int64_t{1} << 22;
};

template <class D, class Precision, class Accumulation, class Checkpoint>
Trace train(Accumulation acc, Checkpoint ck, int updates, Storage storage = {}) {
    using Act = typename Precision::compute_type;
    using Run = std::conditional_t<std::is_same_v<D, Cuda>, CudaRun, HostRun>;
    const GPTConfig c = config();
    Run run;
    snug::GPT<Act, D> model(c, run.tracker);
    const auto w0 = snug::gpt_initial_weights(c, 7);
    model.load_weights(run.ctx.device, w0);
    snug::TrainConfig tc;
    tc.adamw.weight_decay = 0.0f;
    tc.adamw.moments = storage.moments;
    tc.adamw.master = storage.master;
    tc.adamw.offload = storage.offload;
    tc.adamw.offload_chunk = storage.offload_chunk;
    snug::TrainStep<snug::GPT<Act, D>, Precision, Accumulation, Checkpoint> step(model, run.tracker, run.ctx.device,
                                                                                  w0, tc, {}, acc, ck);
    const int micro = acc.steps(), B = 4 / micro, T = 16;
    const Tokens data(micro * B * T, 3);
    std::vector<MicroBatch> mbs;
    auto add_batches = [&](const std::int32_t* tokens, const std::int32_t* targets) {
        for (int m = 0; m < micro; ++m) mbs.push_back({tokens + m * B * T, targets + m * B * T});
    };
    std::optional<DeviceTokens> on_device;
    if constexpr (std::is_same_v<D, Cuda>) {
        on_device.emplace(run.tracker, data);
        add_batches(on_device->tokens.data(), on_device->targets.data());
    } else {
        add_batches(data.tokens.data(), data.targets.data());
    }
    Trace trace;
    for (int s = 0; s < updates; ++s) {
        const snug::StepResult r = step.step(run.ctx, mbs, B, T, 3e-3f);
        trace.losses.push_back(r.loss);
        trace.skipped.push_back(r.skipped);
        if (s == 0) {
            trace.first_norm = r.grad_norm;
            trace.first_grads.resize(static_cast<std::size_t>(model.num_parameters()));
            download(run.ctx.device, trace.first_grads.data(), model.gradients(), model.num_parameters());
        }
    }
    const std::int64_t P = model.num_parameters();
    std::vector<Act> weights(static_cast<std::size_t>(P));
    download(run.ctx.device, weights.data(), model.parameters(), P);
    const auto* bytes = reinterpret_cast<const unsigned char*>(weights.data());
    trace.final_weights.assign(bytes, bytes + weights.size() * sizeof(Act));
    trace.device_state = run.tracker.peak(MemoryCategory::master_weights) + run.tracker.peak(MemoryCategory::optimizer_state);
    trace.host_state = step.optimizer().host_memory().peak_total();
    trace.parameters = P;
    for (const snug::ParameterGroup& g : model.parameter_groups()) trace.largest_group = std::max(trace.largest_group, g.count);
    return trace;
}

// fp32: reduction orders and exp implementations differ, 1e-4; a 16-bit
// precision rounds activations at different points on the two backends, 2e-2.
template <class Precision>
constexpr double tolerance() {
    return std::is_same_v<typename Precision::compute_type, float> ? 1e-4 : 2e-2;
}

template <class Precision, class Accumulation, class Checkpoint>
void matches_host(Accumulation acc = {}, Checkpoint ck = {}, Storage storage = {}) {
    constexpr int updates = 3;
    const Trace host = train<Host, Precision>(acc, ck, updates, storage);
    const Trace cuda = train<Cuda, Precision>(acc, ck, updates, storage);
    const double tol = tolerance<Precision>();
    INFO(Precision::name << " / accumulation " << acc.steps() << " / checkpoint " << Checkpoint::name
                         << " / moments " << snug::moment_storage_name(storage.moments) << ", master "
                         << snug::master_storage_name(storage.master));
    CHECK(cuda.skipped == host.skipped);
    for (int s = 0; s < updates; ++s) {
        INFO("update " << s << ": loss " << cuda.losses[s] << " on CUDA, " << host.losses[s] << " on the host");
        CHECK(std::abs(cuda.losses[s] - host.losses[s]) <= tol * std::abs(host.losses[s]));
    }
    // The first update's gradients, element by element, relative to the largest.
    double max_ref = 0.0, max_err = 0.0;
    for (std::size_t i = 0; i < host.first_grads.size(); ++i) {
        max_ref = std::max(max_ref, double(std::abs(host.first_grads[i])));
        max_err = std::max(max_err, double(std::abs(cuda.first_grads[i] - host.first_grads[i])));
    }
    INFO("first gradients: max error " << max_err << " of max " << max_ref << "; norm " << cuda.first_norm
                                       << " on CUDA, " << host.first_norm << " on the host");
    CHECK(max_err <= tol * max_ref);
    CHECK(std::abs(cuda.first_norm - host.first_norm) <= tol * host.first_norm);
}

template <class Precision, class Checkpoint>
void matches_host_both(Checkpoint ck = {}) {
    matches_host<Precision, snug::accumulate::None, Checkpoint>({}, ck);
    matches_host<Precision, snug::accumulate::Steps, Checkpoint>(snug::accumulate::Steps(2), ck);
}

template <class Precision>
void matches_host_every_checkpoint() {
    matches_host_both<Precision, snug::checkpoint::None>();
    matches_host_both<Precision, snug::checkpoint::Full>();
    matches_host_both<Precision, snug::checkpoint::EveryNth<2>>();
    matches_host_both<Precision, snug::checkpoint::Selective>();
    matches_host_both<Precision, snug::checkpoint::Budget>(snug::checkpoint::Budget(std::size_t{1} << 20));
}

}  // namespace

TEST_CASE("every policy combination on CUDA matches the host: fp32") {
    matches_host_every_checkpoint<snug::precision::Fp32>();
}
TEST_CASE("every policy combination on CUDA matches the host: bf16") {
    matches_host_every_checkpoint<snug::precision::Bf16>();
}
TEST_CASE("every policy combination on CUDA matches the host: fp16, dynamic loss scaling") {
    matches_host_every_checkpoint<snug::precision::Fp16<snug::DynamicLossScaler>>();
}
TEST_CASE("every policy combination on CUDA matches the host: fp16, static loss scaling") {
    matches_host_every_checkpoint<snug::precision::Fp16<snug::StaticLossScaler>>();
}

TEST_CASE("checkpointed and plain CUDA runs give the same gradients") {
    const GPTConfig c = config();
    const Tokens data(3 * 16, 4);
    auto grads_with = [&](snug::Recompute mode) {
        CudaRun run;
        snug::GPT<float, Cuda> model(c, run.tracker);
        model.load_weights(run.ctx.device, snug::gpt_initial_weights(c, 9));
        const std::vector<snug::Recompute> modes(2, mode);
        model.set_recompute(modes);
        model.zero_grad(run.ctx.device);
        DeviceTokens tokens(run.tracker, data);
        model.forward(run.ctx, tokens.tokens.data(), tokens.targets.data(), 3, 16, 1.0f / 48);
        model.backward(run.ctx, tokens.tokens.data());
        std::vector<float> g(static_cast<std::size_t>(model.num_parameters()));
        snug::cuda::copy_to_host(std::span<float>(g), model.gradients());
        CHECK(snug::predict_activation_peak(model, 3, 16, modes) == run.tracker.peak(MemoryCategory::activations));
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

// The same run with the optimizer on the device and offloaded to the host in
// pieces of 512 parameters (so that both gradient slots are reused many
// times): the same losses and final weights, bit for bit; on the device no
// optimizer state; on the host that state and the staging (a copy of the
// working weights, two gradient slots of the longest piece).
template <class Precision>
void offload_matches_device(Storage storage) {
    using Act = typename Precision::compute_type;
    namespace ck = snug::checkpoint;
    const snug::accumulate::Steps two(2);
    INFO(Precision::name << " / moments " << snug::moment_storage_name(storage.moments) << ", master "
                         << snug::master_storage_name(storage.master));
    const Trace on_device = train<Cuda, Precision>(two, ck::None{}, 3, storage);
    storage.offload = true;
    storage.offload_chunk = 600;  // whole blocks of 256: pieces of 512
    const Trace offloaded = train<Cuda, Precision>(two, ck::None{}, 3, storage);
    CHECK(offloaded.skipped == on_device.skipped);
    REQUIRE(offloaded.losses.size() == on_device.losses.size());
    for (std::size_t s = 0; s < on_device.losses.size(); ++s)
        CHECK(std::bit_cast<std::uint32_t>(offloaded.losses[s]) == std::bit_cast<std::uint32_t>(on_device.losses[s]));
    CHECK(offloaded.final_weights == on_device.final_weights);
    CHECK(on_device.device_state > 0);
    CHECK(offloaded.device_state == 0);
    const std::size_t staging = static_cast<std::size_t>(offloaded.parameters) * sizeof(Act) +
                                2 * static_cast<std::size_t>(std::min<std::int64_t>(512, offloaded.largest_group)) * sizeof(float);
    CHECK(offloaded.host_state == on_device.device_state + staging);
    CHECK(on_device.host_state == 0);
}

TEST_CASE("an optimizer offloaded to the host gives the device optimizer's bits, and the device holds no state") {
    using snug::MasterStorage;
    using snug::MomentStorage;
    offload_matches_device<snug::precision::Fp32>(Storage{});
    offload_matches_device<snug::precision::Bf16>(Storage{MomentStorage::int8, MasterStorage::none});
    offload_matches_device<snug::precision::Fp16<snug::DynamicLossScaler>>(Storage{MomentStorage::bf16, MasterStorage::fp32});
}

TEST_CASE("lean optimizer state on CUDA matches the host") {
    using snug::MasterStorage;
    using snug::MomentStorage;
    namespace ck = snug::checkpoint;
    const snug::accumulate::Steps two(2);
    matches_host<snug::precision::Bf16>(two, ck::None{}, Storage{MomentStorage::bf16, MasterStorage::none});
    matches_host<snug::precision::Bf16>(two, ck::Selective{}, Storage{MomentStorage::fp32, MasterStorage::none});
    matches_host<snug::precision::Fp16<snug::DynamicLossScaler>>(two, ck::None{},
                                                                 Storage{MomentStorage::bf16, MasterStorage::fp32});
    matches_host<snug::precision::Fp32>(two, ck::Full{}, Storage{MomentStorage::bf16, MasterStorage::fp32});
    matches_host<snug::precision::Bf16>(two, ck::None{}, Storage{MomentStorage::int8, MasterStorage::none});
}
