// The Llama model (nn/llama.hpp, a CausalLM of LlamaBlocks) on CUDA against
// the same model on the host: one training pass (loss and every parameter
// gradient) for fp32 and bfloat16 from the same weights and tokens, a fully
// checkpointed pass giving the plain CUDA gradients to the bit, and the loss
// falling over a few AdamW updates under TrainStep.
//
// Tolerances: fp32 (TF32 off) loss within 1e-5 relative, gradients within
// 1e-4 of each tensor's largest host gradient; bf16: loss within 1e-2
// relative, whole-gradient cosine similarity > 0.99 (the backends round the
// same 16-bit values in different orders).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "snug/cuda/blas.hpp"
#include "snug/nn/llama.hpp"
#include "snug/snug.hpp"
#include "support/cuda_run.hpp"
#include "support/host_run.hpp"

using snug::Cuda;
using snug::LlamaConfig;
using snug::MemoryCategory;
using snug::Recompute;
using snug::test::CudaRun;

namespace {

// V not a multiple of 8 (padded), head size 12, MLP width 40.
LlamaConfig small_config() { return snug::make_llama_config(61, 40, 2, 48, 4, 40); }

struct PassResult {
    float loss;
    std::vector<float> grads;
};

template <class Act>
PassResult host_pass(const LlamaConfig& c, const std::vector<float>& w, const std::vector<std::int32_t>& tokens,
                     const std::vector<std::int32_t>& targets, int B, int T) {
    snug::test::HostRun run;
    snug::Llama<Act, snug::Host> model(c, run.tracker);
    model.load_weights(run.ctx.device, w);
    model.zero_grad(run.ctx.device);
    const float loss = model.forward(run.ctx, tokens.data(), targets.data(), B, T, 1.0f / float(B * T));
    model.backward(run.ctx, tokens.data());
    return {loss, std::vector<float>(model.gradients(), model.gradients() + model.num_parameters())};
}

template <class Act>
PassResult cuda_pass(const LlamaConfig& c, const std::vector<float>& w, const std::vector<std::int32_t>& tokens,
                     const std::vector<std::int32_t>& targets, int B, int T, Recompute mode = Recompute::none) {
    CudaRun run;
    snug::Llama<Act, Cuda> model(c, run.tracker);
    model.load_weights(run.ctx.device, w);
    model.zero_grad(run.ctx.device);
    const std::vector<Recompute> plan(static_cast<std::size_t>(c.n_layer), mode);
    model.set_recompute(plan);
    snug::Buffer<std::int32_t, Cuda> tok(run.tracker, MemoryCategory::temporaries, tokens.size(), "tokens");
    snug::Buffer<std::int32_t, Cuda> tgt(run.tracker, MemoryCategory::temporaries, targets.size(), "targets");
    snug::cuda::copy_to_device(tok.data(), std::span<const std::int32_t>(tokens));
    snug::cuda::copy_to_device(tgt.data(), std::span<const std::int32_t>(targets));
    const float loss = model.forward(run.ctx, tok.data(), tgt.data(), B, T, 1.0f / float(B * T));
    model.backward(run.ctx, tok.data());
    std::vector<float> grads(static_cast<std::size_t>(model.num_parameters()));
    snug::cuda::copy_to_host(std::span<float>(grads), model.gradients());
    CHECK(run.tracker.current(MemoryCategory::activations) == 0);
    return {loss, grads};
}

}  // namespace

TEMPLATE_TEST_CASE("Llama on CUDA matches Llama on the host", "[cuda][llama]", float, snug::bfloat16) {
    std::random_device device;
    const std::uint64_t seed = device();
    INFO("seed " << seed);
    const LlamaConfig c = small_config();
    snug::MemoryTracker t;
    const snug::Llama<float, snug::Host> layout(c, t);
    auto w = layout.initial_weights(seed);
    snug::Generator g(seed + 1);
    for (float& x : w) x += 0.01f * (g.uniform() - 0.5f);  // norms off one; padded rows not zero (masked anyway)
    const int B = 3, T = 33;
    std::vector<std::int32_t> tokens(B * T), targets(B * T);
    for (auto& id : tokens) id = static_cast<std::int32_t>(g.below(61));
    for (auto& id : targets) id = static_cast<std::int32_t>(g.below(61));

    const auto host = host_pass<TestType>(c, w, tokens, targets, B, T);
    const auto cuda = cuda_pass<TestType>(c, w, tokens, targets, B, T);
    if constexpr (std::is_same_v<TestType, float>) {
        CHECK(std::abs(cuda.loss - host.loss) / host.loss < 1e-5);
        for (const snug::ParameterTensor& p : layout.registry().tensors()) {
            double max_abs = 0, max_ref = 0;
            for (std::int64_t i = p.offset; i < p.offset + p.count(); ++i) {
                max_abs = std::max(max_abs, double(std::abs(cuda.grads[i] - host.grads[i])));
                max_ref = std::max(max_ref, double(std::abs(host.grads[i])));
            }
            INFO(p.name << ": max abs " << max_abs << " of max " << max_ref);
            CHECK(max_ref > 0.0);
            CHECK(max_abs <= 1e-4 * max_ref);
        }
        // Checkpointing replays the same kernels: the same bits.
        const auto full = cuda_pass<TestType>(c, w, tokens, targets, B, T, Recompute::full);
        CHECK(full.loss == cuda.loss);
        CHECK(full.grads == cuda.grads);
    } else {
        CHECK(std::abs(cuda.loss - host.loss) / host.loss < 1e-2);
        double dot = 0, nh = 0, nc = 0;
        for (std::size_t i = 0; i < host.grads.size(); ++i) {
            dot += double(host.grads[i]) * cuda.grads[i];
            nh += double(host.grads[i]) * host.grads[i];
            nc += double(cuda.grads[i]) * cuda.grads[i];
        }
        CHECK(dot / std::sqrt(nh * nc) > 0.99);
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
