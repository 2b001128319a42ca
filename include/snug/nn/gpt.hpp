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
#include "snug/nn/classifier.hpp"
#include "snug/nn/context.hpp"
#include "snug/nn/gpt_config.hpp"
#include "snug/nn/gpt_parameters.hpp"
#include "snug/ops/kernels.hpp"
#include "snug/nn/layer_stack.hpp"
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
        if (dloss != 0.0f && targets == nullptr)
            throw Error("GPT::forward: a training pass (dloss != 0) needs targets");
        forward_to_final_norm(ctx, tokens, B, T);
        const std::int64_t N = std::int64_t{B} * T, C = config_.channels, Vp = config_.padded_vocab_size;
        const GPTTensors<Act> w(params_.data(), config_);
        const GPTTensors<float> g(grads_.data(), config_);
        auto& a = ctx.activations;
        pending_ = dloss != 0.0f ? Pending::backward : Pending::release;
        if (targets == nullptr) {
            logits_ = a.template push<Act>(N * Vp, "logits");
            logits_rows_ = T;
            linear_forward(ctx.device, logits_, lnf_, w[GPTTensor::wte], static_cast<const Act*>(nullptr), N,
                           config_.channels, config_.padded_vocab_size);
            return std::numeric_limits<float>::quiet_NaN();
        }
        float loss = 0.0f;
        try {
            if (dloss != 0.0f) dlnf_ = a.template push<Act>(N * C, "d lnf (from the head)");
            loss = classifier_loss(ctx, dlnf_, dloss != 0.0f ? g[GPTTensor::wte] : nullptr, lnf_, w[GPTTensor::wte],
                                   targets, N, config_.channels, config_.vocab_size, config_.padded_vocab_size, dloss,
                                   config_.classifier_chunk, loss_sum);
        } catch (...) {  // a bad target (host) or no memory: the pass is undone, the gradients untouched
            ctx.scratch.release_to(scratch_mark_);
            a.release_to(mark_);
            end_pass();
            throw;
        }
        ctx.scratch.pop(lnf_);
        lnf_ = nullptr;
        return loss;
    }

    // Forward over tokens (B, T) keeping only each sequence's last logits
    // (B, 1, Vp), readable through logits() until release(): what sampling
    // the next token needs.
    void forward_last(Context<D>& ctx, const std::int32_t* tokens, int B, int T) {
        forward_to_final_norm(ctx, tokens, B, T);
        pending_ = Pending::release;
        logits_ = ctx.activations.template push<Act>(std::int64_t{B} * config_.padded_vocab_size, "last logits");
        logits_rows_ = 1;
        last_position_logits(ctx.device, logits_, lnf_, GPTTensors<Act>(params_.data(), config_)[GPTTensor::wte], B,
                             T, config_.channels, config_.padded_vocab_size);
    }

    // Logits (B, T, Vp) of the last forward without targets, or (B, 1, Vp) of
    // forward_last; valid until release().
    TensorView<Act, D> logits() const {
        if (pending_ == Pending::none || logits_ == nullptr)
            throw Error("GPT::logits: no forward pass without targets is in progress");
        return {logits_, {B_, logits_rows_, config_.padded_vocab_size}};
    }

    // Adds this pass's parameter gradients into gradients() (fp32) and frees
    // the pass's activations.
    void backward(Context<D>& ctx, const std::int32_t* tokens) {
        if (pending_ != Pending::backward)
            throw Error("GPT::backward: needs a preceding forward() with targets and dloss != 0");
        const std::int64_t N = std::int64_t{B_} * T_;
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
        layernorm_backward(dev, dres, g[GPTTensor::lnfw], g[GPTTensor::lnfb], dlnf_, x_last_, w[GPTTensor::lnfw],
                           lnf_mean_, lnf_rstd_, N, C);
        // The head's activations go before the blocks' backward, which may recompute.
        ctx.activations.release_to(head_mark_);
        dres = blocks_.backward(ctx, dres, dother);
        encoder_backward(dev, g[GPTTensor::wte], g[GPTTensor::wpe], dres, tokens, B_, T_, C);
        tmp.release_to(scratch_mark);
        ctx.activations.release_to(mark_);
        end_pass();
    }

    // Ends a forward pass that is not followed by backward (evaluation, sampling).
    void release(Context<D>& ctx) {
        if (pending_ == Pending::none) return;
        if (pending_ == Pending::backward)
            throw Error("GPT::release: this forward pass was a training pass; call backward()");
        ctx.scratch.release_to(scratch_mark_);
        ctx.activations.release_to(mark_);
        end_pass();
    }

    // Mean validation loss of one batch, leaving no trace in the gradients.
    float evaluate(Context<D>& ctx, const std::int32_t* tokens, const std::int32_t* targets, int B, int T) {
        const float loss = forward(ctx, tokens, targets, B, T, 0.0f);
        release(ctx);
        return loss;
    }

private:
    enum class Pending { none, backward, release };

    // The embedding, the blocks and ln_f: lnf_ (B T, C) in ctx.scratch (the
    // caller pops it), its mean and rstd kept for backward.
    void forward_to_final_norm(Context<D>& ctx, const std::int32_t* tokens, int B, int T) {
        if (pending_ != Pending::none)
            throw Error("GPT::forward: the previous pass was not finished (call backward() or release())");
        if (B <= 0 || T <= 0 || T > config_.max_seq_len)
            throw ShapeError("GPT::forward: B = " + std::to_string(B) + " and T = " + std::to_string(T) +
                             " must be positive, T at most max_seq_len = " + std::to_string(config_.max_seq_len));
        B_ = B;
        T_ = T;
        const std::int64_t N = std::int64_t{B} * T, C = config_.channels;
        const D& dev = ctx.device;
        auto& a = ctx.activations;
        mark_ = a.mark();
        scratch_mark_ = ctx.scratch.mark();
        const GPTTensors<Act> w(params_.data(), config_);
        Act* x0 = a.template push<Act>(N * C, "embedding");
        encoder_forward(dev, x0, tokens, w[GPTTensor::wte], w[GPTTensor::wpe], B, T, config_.channels);
        x_last_ = blocks_.forward(ctx, view(x0)).data();
        head_mark_ = a.mark();
        lnf_mean_ = a.template push<float>(N, "lnf mean");
        lnf_rstd_ = a.template push<float>(N, "lnf rstd");
        lnf_ = ctx.scratch.template push<Act>(N * C, "lnf");
        layernorm_forward(dev, lnf_, lnf_mean_, lnf_rstd_, x_last_, w[GPTTensor::lnfw], w[GPTTensor::lnfb], N,
                          config_.channels);
    }

    void end_pass() {
        pending_ = Pending::none;
        lnf_ = dlnf_ = logits_ = nullptr;
    }

    static LayerStack<TransformerBlock<Act, D>> make_blocks(const GPTConfig& c, Act* params, float* grads) {
        const GPTTensors<Act> w(params, c);
        const GPTTensors<float> g(grads, c);
        std::vector<TransformerBlock<Act, D>> blocks;
        blocks.reserve(static_cast<std::size_t>(c.n_layer));
        for (int l = 0; l < c.n_layer; ++l)
            blocks.emplace_back(c.channels, c.n_head, block_tensors<const Act>(w, l), block_tensors<float>(g, l),
                                c.attention);
        return LayerStack<TransformerBlock<Act, D>>(std::move(blocks));
    }

    template <class P, class Q>
    static BlockTensors<P> block_tensors(const GPTTensors<Q>& t, int l) {
        return {t.layer(GPTTensor::ln1w, l), t.layer(GPTTensor::ln1b, l), t.layer(GPTTensor::qkvw, l),
                t.layer(GPTTensor::qkvb, l), t.layer(GPTTensor::attprojw, l), t.layer(GPTTensor::attprojb, l),
                t.layer(GPTTensor::ln2w, l), t.layer(GPTTensor::ln2b, l), t.layer(GPTTensor::fcw, l),
                t.layer(GPTTensor::fcb, l), t.layer(GPTTensor::fcprojw, l), t.layer(GPTTensor::fcprojb, l)};
    }

    TensorView<Act, D> view(Act* p) const { return {p, {B_, T_, config_.channels}}; }

    GPTConfig config_;
    Buffer<Act, D> params_;
    Buffer<float, D> grads_;
    LayerStack<TransformerBlock<Act, D>> blocks_;
    // The current pass.
    Pending pending_ = Pending::none;
    int B_ = 0, T_ = 0;
    typename ActivationArena<D>::Mark mark_{};       // before the embedding
    typename ActivationArena<D>::Mark head_mark_{};  // before ln_f's statistics and the head's
    typename ActivationArena<D>::Mark scratch_mark_{};
    Act* x_last_ = nullptr;  // (B, T, C) the last block's output
    Act* lnf_ = nullptr;     // (B, T, C) in scratch until the head is done
    float* lnf_mean_ = nullptr;
    float* lnf_rstd_ = nullptr;
    Act* dlnf_ = nullptr;    // (B, T, C) training: d loss / d lnf, from the head
    Act* logits_ = nullptr;  // (B, logits_rows_, Vp) without targets
    int logits_rows_ = 0;
};

}  // namespace snug
