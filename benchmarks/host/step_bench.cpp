// Host training-step throughput: one TrainStep (forward, backward, gradient
// norm, AdamW) of the host model — GPT with 4 layers, 4 heads, 128
// channels, vocabulary 256, T = 128, micro-batch 16 — in fp32 and bf16, under
// each checkpoint policy (None, Selective, Full). Counters: tokens/s and model
// FLOP/s (GPTConfig::flops_per_token, which counts no recomputation), plus the
// memory tracker's peak.
//
// Goal (issue 7): fp32 / None at >= 8,000 tokens/s on the 2-core CI machines.
#include <snug/snug.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

namespace {

constexpr int batch = 16;   // B: micro-batch
constexpr int seq = 128;    // T
constexpr int vocab = 256;  // V

snug::GPTConfig host_model() {
    snug::GPTConfig c;
    c.n_layer = 4;
    c.n_head = 4;
    c.channels = 128;
    return c.with_vocab(vocab).with_context(seq);
}

template <class Precision, class Checkpoint>
void train_step(benchmark::State& state) {
    using Model = snug::GPT<typename Precision::compute_type, snug::Host>;
    using Step = snug::TrainStep<Model, Precision, snug::accumulate::None, Checkpoint>;
    const snug::GPTConfig config = host_model();

    snug::MemoryTracker tracker;
    snug::ActivationArena<snug::Host> activations(tracker);
    snug::ActivationArena<snug::Host> scratch(tracker, std::size_t{64} << 20, snug::MemoryCategory::temporaries);
    snug::Context<snug::Host> ctx{{}, activations, scratch};
    Model model(config, tracker);
    const std::vector<float> weights = snug::gpt_initial_weights(config, /*seed=*/1);
    model.load_weights(ctx.device, weights);
    Step step(model, tracker, ctx.device, weights);

    // Random tokens (not a constant: the embedding gradient's scatter and the
    // softmax should see realistic data); targets are the next token.
    std::mt19937 rng(7);
    std::uniform_int_distribution<std::int32_t> id(0, vocab - 1);
    std::vector<std::int32_t> stream(static_cast<std::size_t>(batch) * seq + 1);
    for (auto& t : stream) t = id(rng);
    const std::vector<std::int32_t> tokens(stream.begin(), stream.end() - 1);
    const std::vector<std::int32_t> targets(stream.begin() + 1, stream.end());
    const snug::MicroBatch micro[] = {{tokens.data(), targets.data()}};

    // One step outside the timing: the recompute plan, arena chunks and the
    // thread pool come up here.
    benchmark::DoNotOptimize(step.step(ctx, micro, batch, seq, 1e-4f));

    float loss = 0.0f;
    for (auto _ : state) {
        const snug::StepResult r = step.step(ctx, micro, batch, seq, 1e-4f);
        loss = r.loss;
        benchmark::DoNotOptimize(loss);
    }
    const double tokens_per_step = static_cast<double>(batch) * seq;
    state.counters["tokens/s"] = benchmark::Counter(tokens_per_step, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["GFLOP/s"] = benchmark::Counter(tokens_per_step * config.flops_per_token(seq) * 1e-9,
                                                   benchmark::Counter::kIsIterationInvariantRate);
    state.counters["peak_MiB"] = static_cast<double>(tracker.peak_total()) / (1024.0 * 1024.0);
    state.counters["loss"] = loss;
}

}  // namespace

// The pool's threads work inside each step: rates use wall-clock time.
BENCHMARK(train_step<snug::precision::Fp32, snug::checkpoint::None>)->Name("step/fp32/none")->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(train_step<snug::precision::Fp32, snug::checkpoint::Selective>)->Name("step/fp32/selective")
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(train_step<snug::precision::Fp32, snug::checkpoint::Full>)->Name("step/fp32/full")->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(train_step<snug::precision::Bf16, snug::checkpoint::None>)->Name("step/bf16/none")->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(train_step<snug::precision::Bf16, snug::checkpoint::Selective>)->Name("step/bf16/selective")
    ->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(train_step<snug::precision::Bf16, snug::checkpoint::Full>)->Name("step/bf16/full")->UseRealTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
