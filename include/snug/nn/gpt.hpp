// GPT<Act, D>: a GPT-2 model — token and position embeddings, L pre-LayerNorm
// transformer blocks, a final LayerNorm and the output head tied to the token
// embedding — with an explicit forward (which also computes the loss and,
// when training, the gradient of the logits) and backward.
//
//   Act: activation and working-weight type (float, bfloat16, half)
//   D: device tag (snug::Host, snug::Cuda)
//
// It owns its working weights (MemoryCategory::parameters) and their fp32
// gradients (MemoryCategory::gradients), one contiguous buffer each, in
// llm.c's order (nn/gpt_parameters.hpp). Master weights and optimizer state
// belong to the optimizer; activations to the Context's arenas.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/core/buffer.hpp"
#include "snug/core/half.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/core/rng.hpp"
#include "snug/core/tensor.hpp"
#include "snug/meter/device.hpp"
#include "snug/nn/lm_pass.hpp"
#include "snug/nn/context.hpp"
#include "snug/nn/gpt_config.hpp"
#include "snug/nn/gpt_parameters.hpp"
#include "snug/ops/kernels.hpp"
#include "snug/nn/layer_stack.hpp"
#include "snug/nn/model_of.hpp"
#include "snug/nn/transformer_block.hpp"
#include "snug/nn/upload_weights.hpp"

namespace snug {

// GPT-2's initialisation (gpt_parameter_registry says which tensor starts
// how), in fp32 on the host, deterministic in `seed`.
inline std::vector<float> gpt_initial_weights(const GPTConfig& c, std::uint64_t seed) {
    c.validate();
    return gpt_parameter_registry(c).initial_values(seed);
}

template <class Act, DeviceTag D>
class GPT {
public:
    using value_type = Act;
    using device_type = D;

    GPT(const GPTConfig& config, MemoryTracker& tracker)
        : config_((config.validate(), config)),
          params_(tracker, MemoryCategory::parameters, static_cast<std::size_t>(GPTLayout(config).total()),
                  "GPT parameters"),
          grads_(tracker, MemoryCategory::gradients, static_cast<std::size_t>(GPTLayout(config).total()),
                 "GPT gradients"),
          blocks_(make_blocks(config_, params_.data(), grads_.data())) {
        if constexpr (!std::is_same_v<D, Host> && !std::is_same_v<D, Meter>) {
            // Every tensor and per-layer slice starts at a multiple of C
            // elements; GPU GEMMs need 16-byte aligned operands.
            if (config_.channels % 8 != 0)
                throw ConfigError("GPT on " + std::string(D::name) + ": channels (" +
                                  std::to_string(config_.channels) + ") must be a multiple of 8");
        }
    }

    const GPTConfig& config() const { return config_; }
    std::int64_t num_parameters() const { return static_cast<std::int64_t>(params_.size()); }
    Act* parameters() { return params_.data(); }
    float* gradients() { return grads_.data(); }
    GPTTensors<Act> parameter_tensors() { return {params_.data(), config_}; }
    GPTTensors<float> gradient_tensors() { return {grads_.data(), config_}; }

    // GPT-2's initialisation, in fp32 on the host, deterministic in seed.
    std::vector<float> initial_weights(std::uint64_t seed) const { return gpt_initial_weights(config_, seed); }

    // Sets the working weights from fp32 host values (rounded to Act).
    void load_weights(const D& dev, const std::vector<float>& host_weights) {
        upload_weights(dev, params_.data(), num_parameters(), host_weights, "GPT");
    }

    void zero_grad(const D& dev) { fill_zero(dev, grads_.data(), num_parameters()); }

    // How much each block keeps for backward (a CheckpointPolicy's choice).
    int num_blocks() const { return config_.n_layer; }
    void set_recompute(std::span<const Recompute> modes) { blocks_.set_modes(modes); }
    std::span<const Recompute> recompute() const { return blocks_.modes(); }
    // Its blocks can keep only their GEMM outputs (Recompute::selective).
    static constexpr bool supports_selective() { return true; }

    // The same model on another device: snug::Meter runs it to measure its
    // memory (nn/activation_peak.hpp, train/planner.hpp).
    template <DeviceTag E>
    using on_device = GPT<Act, E>;

    // Which parameters AdamW decays (2-D weights) and which not.
    std::vector<ParameterGroup> parameter_groups() const { return gpt_parameter_groups(config_); }
    // Where block l's tensors lie in the buffers (llm.c's order: one range
    // per tensor kind).
    std::vector<ParameterRange> block_parameters(int l) const {
        return gpt_parameter_registry(config_).ranges("h." + std::to_string(l) + ".");
    }

    // Forward over tokens (B, T) (device memory, ids < V). With targets (B, T),
    // returns the mean per-token cross-entropy, computed a chunk of tokens at a
    // time (nn/classifier.hpp: config().classifier_chunk rows, 0 automatic) so
    // the logits never exist whole; with dloss != 0 (d objective / d each
    // token's loss, e.g. loss_scale / (B T accumulation_steps)) the head's
    // backward runs there too, and backward() must follow; otherwise release()
    // ends the pass. Without targets the result is NaN and the logits (B, T, Vp)
    // are computed whole and stay readable (logits()) until release().
    // With loss_sum (one double in device memory) the pass adds its tokens'
    // summed loss there and returns NaN, reading nothing back: TrainStep reads
    // an update's loss once, not once per micro-batch.
    float forward(Context<D>& ctx, const std::int32_t* tokens, const std::int32_t* targets, int B, int T,
                  float dloss, double* loss_sum = nullptr) {
        pass_.check_forward(targets, dloss);
        Act* lnf = forward_to_final_norm(ctx, tokens, B, T);
        const GPTTensors<Act> w(params_.data(), config_);
        const GPTTensors<float> g(grads_.data(), config_);
        return pass_.head(ctx, lnf, w[GPTTensor::wte], g[GPTTensor::wte], targets, dloss, loss_sum, config_.channels,
                          config_.vocab_size, config_.padded_vocab_size, config_.classifier_chunk);
    }

    // Forward over tokens (B, T) keeping only each sequence's last logits
    // (B, 1, Vp), readable through logits() until release(): what sampling
    // the next token needs.
    void forward_last(Context<D>& ctx, const std::int32_t* tokens, int B, int T) {
        const Act* lnf = forward_to_final_norm(ctx, tokens, B, T);
        pass_.head_last(ctx, lnf, GPTTensors<Act>(params_.data(), config_)[GPTTensor::wte], config_.channels,
                        config_.padded_vocab_size);
    }

    // Logits (B, T, Vp) of the last forward without targets, or (B, 1, Vp) of
    // forward_last; valid until release().
    TensorView<Act, D> logits() const { return pass_.logits(); }

    // Adds this pass's parameter gradients into gradients() (fp32) and frees
    // the pass's activations.
    // `after` (optional) is called as each block's gradients become final.
    void backward(Context<D>& ctx, const std::int32_t* tokens, const AfterBlock& after = {}) {
        const Act* dlnf = pass_.begin_backward();
        const int B = pass_.B(), T = pass_.T();
        const std::int64_t N = std::int64_t{B} * T;
        const int C = config_.channels;
        const D& dev = ctx.device;
        auto& tmp = ctx.scratch;
        const auto scratch_mark = tmp.mark();
        const GPTTensors<Act> w(params_.data(), config_);
        const GPTTensors<float> g(grads_.data(), config_);

        // The head's backward ran in forward (classifier_loss); ln_f's is here.
        Act* dres = tmp.template push<Act>(N * C, "d residual");
        Act* dother = tmp.template push<Act>(N * C, "d residual (other)");
        fill_zero(dev, dres, N * C);
        layernorm_backward(dev, dres, g[GPTTensor::lnfw], g[GPTTensor::lnfb], dlnf, x_last_, w[GPTTensor::lnfw],
                           lnf_mean_, lnf_rstd_, N, C);
        // The head's activations go before the blocks' backward, which may recompute.
        pass_.release_head(ctx);
        dres = blocks_.backward(ctx, dres, dother, after);
        encoder_backward(dev, g[GPTTensor::wte], g[GPTTensor::wpe], dres, tokens, B, T, C);
        tmp.release_to(scratch_mark);
        pass_.end_backward(ctx);
    }

    // Ends a forward pass that is not followed by backward (evaluation, sampling).
    void release(Context<D>& ctx) { pass_.release(ctx); }

    // Mean validation loss of one batch, leaving no trace in the gradients.
    float evaluate(Context<D>& ctx, const std::int32_t* tokens, const std::int32_t* targets, int B, int T) {
        const float loss = forward(ctx, tokens, targets, B, T, 0.0f);
        release(ctx);
        return loss;
    }

private:
    // The embedding, the blocks and ln_f: returns ln_f's output (B T, C), in
    // ctx.scratch (the head pops it); its mean and rstd are kept for backward.
    Act* forward_to_final_norm(Context<D>& ctx, const std::int32_t* tokens, int B, int T) {
        pass_.begin(ctx, B, T, config_.max_seq_len);
        const std::int64_t N = std::int64_t{B} * T, C = config_.channels;
        const D& dev = ctx.device;
        auto& a = ctx.activations;
        const GPTTensors<Act> w(params_.data(), config_);
        Act* x0 = a.template push<Act>(N * C, "embedding");
        encoder_forward(dev, x0, tokens, w[GPTTensor::wte], w[GPTTensor::wpe], B, T, config_.channels);
        x_last_ = blocks_.forward(ctx, TensorView<const Act, D>(x0, {B, T, config_.channels})).data();
        pass_.mark_head(ctx);
        lnf_mean_ = a.template push<float>(N, "lnf mean");
        lnf_rstd_ = a.template push<float>(N, "lnf rstd");
        Act* lnf = ctx.scratch.template push<Act>(N * C, "lnf");
        layernorm_forward(dev, lnf, lnf_mean_, lnf_rstd_, x_last_, w[GPTTensor::lnfw], w[GPTTensor::lnfb], N,
                          config_.channels);
        return lnf;
    }

    static LayerStack<TransformerBlock<Act, D>> make_blocks(const GPTConfig& c, Act* params, float* grads) {
        const GPTTensors<Act> w(params, c);
        const GPTTensors<float> g(grads, c);
        std::vector<TransformerBlock<Act, D>> blocks;
        blocks.reserve(static_cast<std::size_t>(c.n_layer));
        for (int l = 0; l < c.n_layer; ++l)
            blocks.emplace_back(c.channels, c.n_head, block_tensors<const Act>(w, l), block_tensors<float>(g, l),
                                c.attention);
        return LayerStack<TransformerBlock<Act, D>>(std::move(blocks), "block ");
    }

    template <class P, class Q>
    static BlockTensors<P> block_tensors(const GPTTensors<Q>& t, int l) {
        return {t.layer(GPTTensor::ln1w, l), t.layer(GPTTensor::ln1b, l), t.layer(GPTTensor::qkvw, l),
                t.layer(GPTTensor::qkvb, l), t.layer(GPTTensor::attprojw, l), t.layer(GPTTensor::attprojb, l),
                t.layer(GPTTensor::ln2w, l), t.layer(GPTTensor::ln2b, l), t.layer(GPTTensor::fcw, l),
                t.layer(GPTTensor::fcb, l), t.layer(GPTTensor::fcprojw, l), t.layer(GPTTensor::fcprojb, l)};
    }

    GPTConfig config_;
    Buffer<Act, D> params_;
    Buffer<float, D> grads_;
    LayerStack<TransformerBlock<Act, D>> blocks_;
    // The current pass.
    LMPass<Act, D> pass_{"GPT"};
    Act* x_last_ = nullptr;  // (B, T, C) the last block's output
    float* lnf_mean_ = nullptr;
    float* lnf_rstd_ = nullptr;
};

template <class Act, DeviceTag D>
struct ModelOf<GPTConfig, Act, D> {
    using type = GPT<Act, D>;
};

}  // namespace snug
