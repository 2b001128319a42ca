// The GPT model on CUDA against the same model on the host: one training pass
// (loss and every parameter gradient) for fp32 and bfloat16, from the same
// weights and tokens. Runs only where a GPU exists.
//
// Tolerances: fp32 (TF32 off) loss within 1e-5 relative and gradients within
// 1e-4 normwise relative error (max |cuda - host| / max |host| per tensor);
// bf16: loss within 1e-2 relative, whole-gradient cosine similarity > 0.99
// (the two backends round the same 16-bit values in different orders).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "snug/cuda/blas.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/snug.hpp"
#include "support/cuda_run.hpp"
#include "support/host_run.hpp"

using snug::Cuda;
using snug::GPTConfig;
using snug::MemoryCategory;
using snug::test::CudaRun;

namespace {

GPTConfig small_config() {
    GPTConfig c;
    c.vocab_size = 61;  // not a multiple of 8, padded
    c.padded_vocab_size = 64;
    c.max_seq_len = 40;
    c.n_layer = 2;
    c.n_head = 3;
    c.channels = 48;  // head size 16; not a multiple of 32
    return c;
}

template <class Act>
struct PassResult {
    float loss;
    std::vector<float> grads;
};

template <class Act>
PassResult<Act> host_pass(const GPTConfig& c, const std::vector<float>& w, const std::vector<std::int32_t>& tokens,
                          const std::vector<std::int32_t>& targets, int B, int T) {
    snug::test::HostRun run;
    snug::GPT<Act, snug::Host> model(c, run.tracker);
    model.load_weights(run.ctx.device, w);
    model.zero_grad(run.ctx.device);
    const float loss = model.forward(run.ctx, tokens.data(), targets.data(), B, T, 1.0f / float(B * T));
    model.backward(run.ctx, tokens.data());
    return {loss, std::vector<float>(model.gradients(), model.gradients() + model.num_parameters())};
}

template <class Act>
PassResult<Act> cuda_pass(const GPTConfig& c, const std::vector<float>& w, const std::vector<std::int32_t>& tokens,
                          const std::vector<std::int32_t>& targets, int B, int T) {
    CudaRun run;
    snug::GPT<Act, Cuda> model(c, run.tracker);
    model.load_weights(run.ctx.device, w);
    model.zero_grad(run.ctx.device);
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

TEMPLATE_TEST_CASE("GPT on CUDA matches GPT on the host", "", float, snug::bfloat16) {
    std::random_device device;
    const std::uint64_t seed = device();
    INFO("seed " << seed);
    const GPTConfig c = small_config();
    const auto w = snug::gpt_initial_weights(c, seed);
    snug::Generator g(seed + 1);
    const int B = 3, T = 33;
    std::vector<std::int32_t> tokens(B * T), targets(B * T);
    for (auto& t : tokens) t = static_cast<std::int32_t>(g.below(61));
    for (auto& t : targets) t = static_cast<std::int32_t>(g.below(61));

    const auto host = host_pass<TestType>(c, w, tokens, targets, B, T);
    const auto cuda = cuda_pass<TestType>(c, w, tokens, targets, B, T);
    if constexpr (std::is_same_v<TestType, float>) {
        CHECK(std::abs(cuda.loss - host.loss) / host.loss < 1e-5);
        for (const snug::ParameterTensor& t : snug::gpt_named_tensors(c)) {
            double max_abs = 0, max_ref = 0;
            for (std::int64_t i = t.offset; i < t.offset + t.shape.numel(); ++i) {
                max_abs = std::max(max_abs, double(std::abs(cuda.grads[i] - host.grads[i])));
                max_ref = std::max(max_ref, double(std::abs(host.grads[i])));
            }
            INFO(t.name << ": max abs " << max_abs << " of max " << max_ref);
            CHECK(max_abs <= 1e-4 * max_ref);
        }
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

TEST_CASE("GPT on CUDA needs channels that keep tensors 16-byte aligned") {
    GPTConfig c = small_config();
    c.channels = 36;
    c.n_head = 3;
    snug::MemoryTracker tracker;
    CHECK_THROWS_WITH((snug::GPT<float, Cuda>(c, tracker)), Catch::Contains("multiple of 8"));
}
