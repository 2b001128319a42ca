// The Llama model (nn/llama.hpp, a CausalLM of LlamaBlocks) on CUDA against
// the same model on the host: one training pass (loss and every parameter
// gradient) for fp32 and bfloat16 from the same weights and tokens, a fully
// checkpointed pass giving the plain CUDA gradients to the bit, and the loss
// falling over a few AdamW updates under TrainStep.
//
// Tolerances: support/model_pass.hpp's (fp32 gradients within 1e-4 of each
// tensor's largest; bf16 by cosine similarity).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "snug/cuda/blas.hpp"
#include "snug/nn/llama.hpp"
#include "snug/snug.hpp"
#include "support/model_pass.hpp"

using snug::Cuda;
using snug::LlamaConfig;
using snug::MemoryCategory;
using snug::Recompute;
using namespace snug::test;

namespace {

// V not a multiple of 8 (padded), head size 12, MLP width 40; kv_heads 0
// (as many as heads) or fewer (grouped-query attention).
LlamaConfig small_config(int kv_heads = 0) { return snug::make_llama_config(61, 40, 2, 48, 4, 40, kv_heads); }

}  // namespace

TEMPLATE_TEST_CASE("Llama on CUDA matches Llama on the host", "[cuda][llama]", float, snug::bfloat16) {
    std::random_device device;
    const std::uint64_t seed = device();
    const int kv_heads = GENERATE(0, 2);
    INFO("seed " << seed << ", key/value heads " << kv_heads);
    const LlamaConfig c = small_config(kv_heads);
    snug::MemoryTracker t;
    const snug::Llama<float, snug::Host> layout(c, t);
    auto w = layout.initial_weights(seed);
    snug::Generator g(seed + 1);
    for (float& x : w) x += 0.01f * (g.uniform() - 0.5f);  // norms off one; padded rows not zero (masked anyway)
    const int B = 3, T = 33;
    std::vector<std::int32_t> tokens(B * T), targets(B * T);
    for (auto& id : tokens) id = static_cast<std::int32_t>(g.below(61));
    for (auto& id : targets) id = static_cast<std::int32_t>(g.below(61));

    const auto host = training_pass<snug::Llama<TestType, snug::Host>>(c, w, tokens, targets, B, T);
    const auto cuda = training_pass<snug::Llama<TestType, Cuda>>(c, w, tokens, targets, B, T);
    check_pass_close<TestType>(cuda, host, layout.registry().tensors());
    if constexpr (std::is_same_v<TestType, float>) {
        // Checkpointing replays the same kernels: the same bits.
        const auto full = training_pass<snug::Llama<TestType, Cuda>>(c, w, tokens, targets, B, T, Recompute::full);
        CHECK(full.loss == cuda.loss);
        CHECK(full.grads == cuda.grads);
    }
}

TEST_CASE("Llama on CUDA trains under TrainStep: the loss falls", "[cuda][llama]") {
    using Model = snug::Llama<snug::bfloat16, Cuda>;
    const LlamaConfig c = snug::make_llama_config(16, 8, 2, 16, 2, 32);
    CudaRun run;
    Model model(c, run.tracker);
    const std::vector<float> w0 = model.initial_weights(7);
    model.load_weights(run.ctx.device, w0);
    snug::TrainStep<Model, snug::precision::Bf16, snug::accumulate::None, snug::checkpoint::Full> step(
        model, run.tracker, run.ctx.device, w0);
    const int B = 4, T = 8;
    snug::Buffer<std::int32_t, Cuda> tok(run.tracker, MemoryCategory::workspace, B * T, "tokens");
    snug::Buffer<std::int32_t, Cuda> tgt(run.tracker, MemoryCategory::workspace, B * T, "targets");
    snug::Generator g(8);
    std::vector<float> losses;
    for (int u = 0; u < 30; ++u) {
        std::vector<std::int32_t> tokens(B * T), targets(B * T);
        for (std::size_t i = 0; i < tokens.size(); ++i) {
            tokens[i] = static_cast<std::int32_t>(g.below(16));
            targets[i] = (tokens[i] * 3 + 1) % 16;
        }
        snug::cuda::copy_to_device(tok.data(), std::span<const std::int32_t>(tokens));
        snug::cuda::copy_to_device(tgt.data(), std::span<const std::int32_t>(targets));
        const snug::MicroBatch mb[] = {{tok.data(), tgt.data()}};
        losses.push_back(step.step(run.ctx, mb, B, T, 1e-2f).loss);
    }
    INFO("first loss " << losses.front() << ", last " << losses.back());
    CHECK(losses.back() < 0.5f * losses.front());
}
