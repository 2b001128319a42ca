// quickstart: the README's taste of snug, compiled and run by the tests so it
// stays true. A bf16 GPT on the host backend, two micro-batches per update,
// every second block checkpointed, under a 12 GiB budget.
#include <snug/snug.hpp>
#include <cstdio>
#include <vector>

int main() {
    using Model = snug::GPT<snug::bfloat16, snug::Host>;              // snug::Cuda on a GPU
    using Step = snug::TrainStep<Model, snug::precision::Bf16,           // or Fp32, Fp16<DynamicLossScaler>
                                 snug::accumulate::Steps,                // n micro-batches per update
                                 snug::checkpoint::EveryNth<2>>;         // or None, Full, Selective, Budget
    const auto config = snug::GPTConfig::preset("d2").with_vocab(256).with_context(64);
    snug::MemoryTracker tracker(snug::parse_bytes("12GiB"));             // over budget: OutOfMemory + breakdown
    snug::ActivationArena<snug::Host> activations(tracker), scratch(tracker, 64 << 20, snug::MemoryCategory::temporaries);
    snug::Context<snug::Host> ctx{{}, activations, scratch};

    Model model(config, tracker);
    const auto weights = snug::gpt_initial_weights(config, /*seed=*/1);
    model.load_weights(ctx.device, weights);
    Step step(model, tracker, ctx.device, weights, {}, {}, snug::accumulate::Steps(2));

    std::vector<std::int32_t> tokens(2 * 4 * 64, 7), targets(tokens.size(), 8);   // two micro-batches of (4, 64)
    const snug::MicroBatch batches[] = {{tokens.data(), targets.data()}, {tokens.data() + 256, targets.data() + 256}};
    float first = 0, last = 0;
    for (int i = 0; i < 5; ++i) {
        const snug::StepResult r = step.step(ctx, batches, /*B=*/4, /*T=*/64, /*lr=*/1e-3f);
        std::printf("loss %.4f  grad norm %.3f  skipped %d\n", r.loss, r.grad_norm, r.skipped);
        (i == 0 ? first : last) = r.loss;
    }
    std::puts(tracker.report().c_str());                                 // current and peak bytes per category
    return last < first ? 0 : 1;                                         // the loss fell
}
