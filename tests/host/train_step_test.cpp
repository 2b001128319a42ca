// TrainStep on the host: accumulation of n micro-batches equals one batch of
// n·b; the update's loss is the mean of its micro-batches' (summed on the
// device); an injected fp16 overflow skips the update and leaves every weight,
// master weight and moment exactly as it was while the scale backs off; every
// combination of the three policies trains a d2-shaped GPT with falling loss.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "snug/core/rng.hpp"
#include "snug/dist/communicator.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/train/train_step.hpp"
#include "support/host_run.hpp"

using snug::GPTConfig;
using snug::Host;
using snug::MicroBatch;

namespace {

// The d2 preset's depth and width with a small vocabulary and context.
GPTConfig d2() { return GPTConfig::preset("d2").with_vocab(64).with_context(16); }

struct Tokens {
    std::vector<std::int32_t> tokens, targets;
    Tokens(int n, std::uint64_t seed) : tokens(static_cast<std::size_t>(n)), targets(static_cast<std::size_t>(n)) {
        snug::Generator g(seed);
        // A learnable pattern: the target is a fixed function of the token.
        for (std::size_t i = 0; i < tokens.size(); ++i) {
            tokens[i] = static_cast<std::int32_t>(g.below(64));
            targets[i] = (tokens[i] * 7 + 3) % 64;
        }
    }
    MicroBatch slice(int begin) const { return {tokens.data() + begin, targets.data() + begin}; }
};

template <class Precision, class Accumulation, class Checkpoint>
std::vector<float> train(int steps, int micro, int B, int T, float lr, Accumulation acc = {}, Checkpoint ck = {},
                         Precision precision = {}) {
    using Act = typename Precision::compute_type;
    const GPTConfig c = d2();
    snug::test::HostRun run;
    snug::GPT<Act, Host> model(c, run.tracker);
    const auto w0 = snug::gpt_initial_weights(c, 77);
    model.load_weights(run.ctx.device, w0);
    snug::TrainConfig tc;
    tc.adamw.weight_decay = 0.0f;
    snug::TrainStep<snug::GPT<Act, Host>, Precision, Accumulation, Checkpoint> step(
        model, run.tracker, run.ctx.device, w0, tc, precision, acc, ck);
    const Tokens data(micro * B * T, 5);
    std::vector<MicroBatch> mbs;
    for (int m = 0; m < micro; ++m) mbs.push_back(data.slice(m * B * T));
    std::vector<float> losses;
    for (int s = 0; s < steps; ++s) {
        const snug::StepResult r = step.step(run.ctx, mbs, B, T, lr);
        CHECK(r.tokens == std::int64_t{micro} * B * T);
        if (!r.skipped) losses.push_back(r.loss);
    }
    return losses;
}

}  // namespace

TEST_CASE("n micro-batches of b give the update of one batch of n*b") {
    const GPTConfig c = d2();
    const auto w0 = snug::gpt_initial_weights(c, 3);
    const Tokens data(4 * 8, 9);
    auto one_update = [&](int micro, int B, std::vector<float>& grads, std::vector<float>& weights) {
        snug::test::HostRun run;
        snug::GPT<float, Host> model(c, run.tracker);
        model.load_weights(run.ctx.device, w0);
        snug::TrainStep<snug::GPT<float, Host>, snug::precision::Fp32, snug::accumulate::Steps,
                        snug::checkpoint::None>
            step(model, run.tracker, run.ctx.device, w0, {}, {}, snug::accumulate::Steps(micro));
        std::vector<MicroBatch> mbs;
        for (int m = 0; m < micro; ++m) mbs.push_back(data.slice(m * B * 8));
        const auto r = step.step(run.ctx, mbs, B, 8, 1e-3f);
        grads.assign(model.gradients(), model.gradients() + model.num_parameters());
        weights.assign(model.parameters(), model.parameters() + model.num_parameters());
        return r;
    };
    std::vector<float> g1, w1, g4, w4;
    const auto r1 = one_update(1, 4, g1, w1);
    const auto r4 = one_update(4, 1, g4, w4);
    CHECK(r4.loss == Approx(r1.loss).epsilon(1e-6));
    CHECK(r4.grad_norm == Approx(r1.grad_norm).epsilon(1e-5));
    // Every tensor — biases and both embeddings included — within 1e-5 relative.
    for (const snug::ParameterTensor& t : snug::gpt_named_tensors(c)) {
        double max_abs = 0, max_ref = 0;
        for (std::int64_t i = t.offset; i < t.offset + t.shape.numel(); ++i) {
            max_abs = std::max(max_abs, double(std::abs(g4[std::size_t(i)] - g1[std::size_t(i)])));
            max_ref = std::max(max_ref, double(std::abs(g1[std::size_t(i)])));
        }
        INFO(t.name);
        CHECK(max_abs <= 1e-5 * max_ref);
    }
    // (The updated weights are not compared to 1e-5: Adam's first step moves each
    // weight by about lr · g / |g|, so a gradient near 0 turns rounding noise
    // into a visible difference. The gradients are what accumulation must match.)
}

TEST_CASE("an update's loss is the mean over its micro-batches, summed on the device in 8 bytes of workspace") {
    const GPTConfig c = d2();
    const auto w0 = snug::gpt_initial_weights(c, 4);
    const Tokens data(3 * 2 * 8, 12);
    // Each micro-batch's loss, evaluated on its own with the same weights.
    double expected = 0.0;
    {
        snug::test::HostRun run;
        snug::GPT<float, Host> model(c, run.tracker);
        model.load_weights(run.ctx.device, w0);
        for (int m = 0; m < 3; ++m) {
            const MicroBatch mb = data.slice(m * 2 * 8);
            expected += model.evaluate(run.ctx, mb.tokens, mb.targets, 2, 8) / 3.0;
        }
    }
    snug::test::HostRun run;
    snug::GPT<float, Host> model(c, run.tracker);
    model.load_weights(run.ctx.device, w0);
    const std::size_t before = run.tracker.current(snug::MemoryCategory::workspace);
    snug::TrainStep<snug::GPT<float, Host>, snug::precision::Fp32, snug::accumulate::Steps, snug::checkpoint::None>
        step(model, run.tracker, run.ctx.device, w0, {}, {}, snug::accumulate::Steps(3));
    // The overflow flag and the norm (a float each), the loss total (a double).
    CHECK(run.tracker.current(snug::MemoryCategory::workspace) - before == 4 + 4 + 8);
    const std::vector<MicroBatch> mbs{data.slice(0), data.slice(16), data.slice(32)};
    // Learning rate 0: the weights stay, so each update sees the same losses.
    const snug::StepResult first = step.step(run.ctx, mbs, 2, 8, 0.0f);
    CHECK(first.loss == Approx(expected).epsilon(1e-6));
    // The total starts again at zero each update: the same mean, not twice it.
    const snug::StepResult second = step.step(run.ctx, mbs, 2, 8, 0.0f);
    CHECK(second.loss == first.loss);
}

TEST_CASE("an fp16 overflow skips the update and leaves every weight and moment as it was") {
    const GPTConfig c = d2();
    snug::test::HostRun run;
    snug::GPT<snug::half, Host> model(c, run.tracker);
    const auto w0 = snug::gpt_initial_weights(c, 4);
    model.load_weights(run.ctx.device, w0);
    using Fp16 = snug::precision::Fp16<snug::DynamicLossScaler>;
    snug::DynamicLossScalerConfig sc;
    sc.init_scale = 1e30f;  // the scaled loss gradient overflows fp16 at once
    Fp16 precision;
    precision.scaler = snug::DynamicLossScaler(sc);
    snug::TrainStep<snug::GPT<snug::half, Host>, Fp16, snug::accumulate::None, snug::checkpoint::None> step(
        model, run.tracker, run.ctx.device, w0, {}, precision);
    const Tokens data(2 * 8, 1);
    const MicroBatch mb = data.slice(0);
    const std::int64_t P = model.num_parameters();
    auto snapshot = [&] {
        std::vector<std::uint16_t> params(static_cast<std::size_t>(P));
        std::memcpy(params.data(), model.parameters(), params.size() * 2);
        std::vector<float> state(step.optimizer().master(), step.optimizer().master() + P);
        state.insert(state.end(), step.optimizer().first_moment(), step.optimizer().first_moment() + P);
        state.insert(state.end(), step.optimizer().second_moment(), step.optimizer().second_moment() + P);
        return std::make_pair(params, state);
    };
    const auto before = snapshot();
    const snug::StepResult r = step.step(run.ctx, std::span<const MicroBatch>(&mb, 1), 2, 8, 1e-3f);
    CHECK(r.skipped);
    CHECK(r.loss_scale == 1e30f);
    CHECK(step.scaler.scale() == 0.5e30f);
    CHECK(step.scaler.skipped_steps() == 1);
    CHECK(step.optimizer().steps() == 0);
    const auto after = snapshot();
    CHECK(after.first == before.first);    // working fp16 weights, bit for bit
    CHECK(after.second == before.second);  // master weights and both moments
    // Backing off far enough, the same step goes through.
    int skipped = 1;
    snug::StepResult last = r;
    for (int i = 0; i < 200 && last.skipped; ++i) {
        last = step.step(run.ctx, std::span<const MicroBatch>(&mb, 1), 2, 8, 1e-3f);
        skipped += last.skipped;
    }
    CHECK_FALSE(last.skipped);
    CHECK(step.optimizer().steps() == 1);
    CHECK(step.skipped_steps() == skipped);
    CHECK(std::isfinite(last.grad_norm));
}

TEST_CASE("micro-batch count must match the accumulation policy") {
    const GPTConfig c = d2();
    snug::test::HostRun run;
    snug::GPT<float, Host> model(c, run.tracker);
    const auto w0 = snug::gpt_initial_weights(c, 4);
    model.load_weights(run.ctx.device, w0);
    snug::TrainStep<snug::GPT<float, Host>, snug::precision::Fp32, snug::accumulate::Steps, snug::checkpoint::Full>
        step(model, run.tracker, run.ctx.device, w0, {}, {}, snug::accumulate::Steps(3));
    const Tokens data(8, 1);
    const MicroBatch mb = data.slice(0);
    CHECK_THROWS_WITH(step.step(run.ctx, std::span<const MicroBatch>(&mb, 1), 1, 8, 1e-3f),
                      Catch::Contains("1 micro-batches for an update of 3"));
    CHECK_THROWS_AS(snug::accumulate::Steps(0), snug::ConfigError);
}

TEST_CASE("TrainStep's accumulation argument may be left out: accumulate::Steps defaults to one micro-batch") {
    // This file compiles with -Werror: the defaulted `Accumulation accumulation = {}`
    // must not need an explicit constructor (it once warned and failed to build).
    const GPTConfig c = d2();
    snug::test::HostRun run;
    snug::GPT<float, Host> model(c, run.tracker);
    const auto w0 = snug::gpt_initial_weights(c, 4);
    model.load_weights(run.ctx.device, w0);
    snug::TrainStep<snug::GPT<float, Host>, snug::precision::Fp32, snug::accumulate::Steps, snug::checkpoint::None>
        step(model, run.tracker, run.ctx.device, w0);
    CHECK(step.steps() == 1);
    step.set_steps(4);
    CHECK(step.steps() == 4);
}

namespace {

// A GPT whose blocks claim the parameters `claim` says: what TrainStep checks
// before it sums gradients block by block.
struct MisplacedBlocks : snug::GPT<float, Host> {
    using GPT::GPT;
    std::vector<snug::ParameterRange> (*claim)(int l, std::int64_t P) = nullptr;
    std::vector<snug::ParameterRange> block_parameters(int l) const { return claim(l, num_parameters()); }
};

}  // namespace

TEST_CASE("data parallel refuses blocks whose parameters overlap or lie outside the model, naming them") {
    static_assert(snug::BlockwiseBackward<MisplacedBlocks>);
    const GPTConfig c = d2();
    snug::test::HostRun run;
    MisplacedBlocks model(c, run.tracker);
    using Step =
        snug::TrainStep<MisplacedBlocks, snug::precision::Fp32, snug::accumulate::None, snug::checkpoint::None>;
    Step step(model, run.tracker, run.ctx.device, snug::gpt_initial_weights(c, 4));
    snug::dist::Communicator<Host> comm(snug::dist::single_process());
    // Blocks 0 and 1 both starting at parameter 100.
    model.claim = [](int, std::int64_t) { return std::vector<snug::ParameterRange>{{100, 10}}; };
    CHECK_THROWS_WITH(step.data_parallel(comm), Catch::Contains("blocks 0 and 1 both claim parameter 100"));
    // Block 1 running past the end.
    model.claim = [](int l, std::int64_t P) {
        return std::vector<snug::ParameterRange>{{l == 1 ? P - 5 : 0, 10}};
    };
    CHECK_THROWS_WITH(step.data_parallel(comm), Catch::Contains("block 1's parameters [") &&
                                                    Catch::Contains(") lie outside the model's "));
    // Disjoint blocks are taken.
    model.claim = [](int l, std::int64_t) { return std::vector<snug::ParameterRange>{{10 * l, 10}}; };
    CHECK_NOTHROW(step.data_parallel(comm));
}

namespace {

template <class Precision, class Accumulation, class Checkpoint>
void trains(Accumulation acc = {}, Checkpoint ck = {}) {
    const int micro = acc.steps();
    const auto losses = train<Precision, Accumulation, Checkpoint>(12, micro, 4 / micro, 8, 3e-3f, acc, ck);
    INFO(Precision::name << " / accumulation " << micro << " / checkpoint " << Checkpoint::name);
    REQUIRE(losses.size() >= 6);
    CHECK(losses.back() < 0.8f * losses.front());
}

template <class Precision, class Checkpoint>
void trains_both_accumulations(Checkpoint ck = {}) {
    trains<Precision, snug::accumulate::None, Checkpoint>({}, ck);
    trains<Precision, snug::accumulate::Steps, Checkpoint>(snug::accumulate::Steps(2), ck);
}

template <class Precision>
void trains_every_checkpoint() {
    trains_both_accumulations<Precision, snug::checkpoint::None>();
    trains_both_accumulations<Precision, snug::checkpoint::Full>();
    trains_both_accumulations<Precision, snug::checkpoint::EveryNth<2>>();
    trains_both_accumulations<Precision, snug::checkpoint::Selective>();
    trains_both_accumulations<Precision, snug::checkpoint::Budget>(snug::checkpoint::Budget(std::size_t{1} << 20));
}

}  // namespace

TEST_CASE("every combination of the three policies trains a d2 GPT: the loss falls") {
    trains_every_checkpoint<snug::precision::Fp32>();
    trains_every_checkpoint<snug::precision::Bf16>();
    trains_every_checkpoint<snug::precision::Fp16<snug::DynamicLossScaler>>();
    trains_every_checkpoint<snug::precision::Fp16<snug::StaticLossScaler>>();
}
