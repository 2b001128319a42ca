// CausalLM<Family, Act, D>: the whole model around a stack of a user's
// blocks — token embedding (learned positions optional), the blocks in a
// LayerStack (so every checkpoint policy applies), a final norm, the output
// head (tied to the embedding or its own) and the cross-entropy loss — as a
// TrainableModel that TrainStep drives, the planner meters and the state
// files name. A user writes the block (or takes LlamaBlock) and a Family:
//
//   struct MyFamily {
//       using BlockShape = ...;                           // what one block needs
//       template <class Act, snug::DeviceTag D>
//       using Block = MyBlock<Act, D>;                    // a Layer; ctor (registry, prefix, BlockShape)
//       template <class Act, snug::DeviceTag D>
//       using FinalNorm = snug::RMSNorm<Act, D>;          // a norm module, ctor (registry, name, C)
//       static int channels(const BlockShape&);
//       static constexpr bool learned_positions = false;  // wpe (maxT, C) added to the embedding
//       static constexpr bool tied_head = false;          // the head reuses the embedding's table
//       // Optional: the final norm made with the family's settings (its
//       // epsilon, say); without it, FinalNorm(registry, name, C).
//       template <class Act, snug::DeviceTag D>
//       static FinalNorm<Act, D> final_norm(snug::ParameterRegistry&, const std::string& name, const BlockShape&);
//       // Optional, for state files (nn/model_identity.hpp): the family's name
//       // and the block fields that change what the model computes, so that a
//       // state is not resumed into a model of another shape (say, another
//       // head count with as many parameters). Without them a state file
//       // still checks the tensors' names and shapes.
//       static constexpr std::string_view name = "mine";
//       static std::vector<snug::ModelField> fields(const BlockShape&);
//   };
//
// The contract above is nn/family.hpp's CausalLMFamily: a family or block that
// misses a member fails to compile with a sentence naming it.
//
// Tensors, in this order: embed_tokens.weight (Vp, C) [, embed_positions.weight
// (maxT, C)], layers.<l>.<the block's>, norm.weight, [lm_head.weight (Vp, C)].
// The padded rows of the vocabulary start at zero and stay there.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/core/buffer.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/core/tensor.hpp"
#include "snug/meter/device.hpp"
#include "snug/nn/context.hpp"
#include "snug/nn/family.hpp"
#include "snug/nn/layer_stack.hpp"
#include "snug/nn/lm_pass.hpp"
#include "snug/nn/model_identity.hpp"
#include "snug/nn/model_of.hpp"
#include "snug/nn/model_summary.hpp"
#include "snug/nn/module.hpp"
#include "snug/nn/parameters.hpp"
#include "snug/nn/upload_weights.hpp"
#include "snug/ops/kernels.hpp"

namespace snug {

// The sizes of a CausalLM of a family's blocks.
template <class Family>
struct CausalLMConfig {
    static_assert(FamilyBlockShape<Family>, "CausalLM family: needs `using BlockShape = ...;` (what one block needs)");
    using BlockShape = typename Family::BlockShape;

    int vocab_size = 0;         // V: token ids in [0, V)
    int padded_vocab_size = 0;  // Vp >= V: the embedding's and the head's rows (a multiple of 64 is fast)
    int max_seq_len = 0;        // T at most this
    int n_layer = 0;
    BlockShape block{};
    std::int64_t classifier_chunk = 0;  // tokens per chunk of the head and loss (nn/classifier.hpp; 0: automatic)

    // Vp for a vocabulary: the next multiple of 64 (GEMM-friendly rows).
    static int pad_vocab(int vocab) { return (vocab + 63) / 64 * 64; }
};

template <class Family, class Act, DeviceTag D>
class CausalLM {
    static_assert(check_family<Family, Act, D>());

public:
    using value_type = Act;
    using device_type = D;
    using Config = CausalLMConfig<Family>;
    using Block = typename Family::template Block<Act, D>;

    // The same model on another device tag (snug::Meter measures its memory).
    template <DeviceTag E>
    using on_device = CausalLM<Family, Act, E>;

    CausalLM(const Config& config, MemoryTracker& tracker)
        : config_(validated(config)),
          C_(Family::channels(config.block)),
          embed_(registry_.add("embed_tokens.weight", Shape{config.padded_vocab_size, C_},
                               Init::normal(0.02f, std::int64_t{config.vocab_size} * C_), Decay::yes)),
          positions_(Family::learned_positions
                         ? registry_.add("embed_positions.weight", Shape{config.max_seq_len, C_}, Init::normal(0.02f),
                                         Decay::yes)
                         : -1),
          blocks_(make_blocks(registry_, config_)),
          norm_(make_final_norm(registry_, config_)),
          head_(Family::tied_head ? embed_
                                  : registry_.add("lm_head.weight", Shape{config.padded_vocab_size, C_},
                                                  Init::normal(0.02f, std::int64_t{config.vocab_size} * C_),
                                                  Decay::yes)),
          params_(tracker, MemoryCategory::parameters, static_cast<std::size_t>(registry_.total()), "model parameters"),
          grads_(tracker, MemoryCategory::gradients, static_cast<std::size_t>(registry_.total()), "model gradients") {
        const ParameterBinding<Act> b{params_.data(), grads_.data()};
        for (std::size_t l = 0; l < blocks_.size(); ++l) blocks_[l].bind(b);
        norm_.bind(b);
    }

    const Config& config() const { return config_; }
    const ParameterRegistry& registry() const { return registry_; }
    std::int64_t num_parameters() const { return registry_.total(); }
    Act* parameters() { return params_.data(); }
    float* gradients() { return grads_.data(); }
    std::vector<ParameterGroup> parameter_groups() const { return registry_.groups(); }
    // What a state file records to refuse resuming into another model: the
    // family's name and fields (where it gives them), the sizes, the tensors.
    ModelIdentity identity() const {
        ModelIdentity id;
        if constexpr (requires { Family::name; }) id.family = std::string(Family::name);
        id.config = {{"vocab_size", static_cast<double>(config_.vocab_size)},
                     {"padded_vocab_size", static_cast<double>(config_.padded_vocab_size)},
                     {"max_seq_len", static_cast<double>(config_.max_seq_len)},
                     {"n_layer", static_cast<double>(config_.n_layer)}};
        if constexpr (requires { Family::fields(config_.block); })
            for (ModelField& f : Family::fields(config_.block)) id.config.push_back(std::move(f));
        for (const ParameterTensor& t : registry_.tensors()) {
            ModelTensor& m = id.tensors.emplace_back(ModelTensor{t.name, {}});
            for (int d = 0; d < t.shape.rank(); ++d) m.shape.push_back(t.shape[d]);
        }
        return id;
    }
    // Where block l's tensors lie in the buffers (one range: a block
    // declares its tensors together).
    std::vector<ParameterRange> block_parameters(int l) const {
        return registry_.ranges("layers." + std::to_string(l) + ".");
    }

    // The registry's initialisation, in fp32 on the host, deterministic in seed.
    std::vector<float> initial_weights(std::uint64_t seed) const { return registry_.initial_values(seed); }

    // Sets the working weights from fp32 host values (rounded to Act).
    void load_weights(const D& dev, const std::vector<float>& host_weights) {
        upload_weights(dev, params_.data(), num_parameters(), host_weights, "CausalLM");
    }

    void zero_grad(const D& dev) { fill_zero(dev, grads_.data(), num_parameters()); }

    int num_blocks() const { return config_.n_layer; }
    void set_recompute(std::span<const Recompute> modes) { blocks_.set_modes(modes); }
    std::span<const Recompute> recompute() const { return blocks_.modes(); }
    static constexpr bool supports_selective() { return SelectiveLayer<Block>; }

    // Forward over tokens (B, T) (device memory, ids < V). With targets (B, T),
    // the mean per-token cross-entropy, a chunk of tokens at a time
    // (nn/classifier.hpp: config().classifier_chunk, 0 automatic); with dloss
    // != 0 (d objective / d each token's loss) the head's backward runs there
    // too and backward() must follow, otherwise release(). Without targets the
    // result is NaN and the logits (B, T, Vp) are computed whole and stay
    // readable until release().
    // With loss_sum (one double in device memory) the pass adds its tokens'
    // summed loss there and returns NaN, reading nothing back: TrainStep reads
    // an update's loss once, not once per micro-batch.
    float forward(Context<D>& ctx, const std::int32_t* tokens, const std::int32_t* targets, int B, int T,
                  float dloss, double* loss_sum = nullptr) {
        pass_.check_forward(targets, dloss);
        Act* normed = forward_to_final_norm(ctx, tokens, B, T);
        return pass_.head(ctx, normed, param(head_), grad(head_), targets, dloss, loss_sum, C_, config_.vocab_size,
                          config_.padded_vocab_size, config_.classifier_chunk);
    }

    // Forward over tokens (B, T) keeping only each sequence's last logits
    // (B, 1, Vp), readable through logits() until release(): what sampling
    // the next token needs.
    void forward_last(Context<D>& ctx, const std::int32_t* tokens, int B, int T) {
        const Act* normed = forward_to_final_norm(ctx, tokens, B, T);
        pass_.head_last(ctx, normed, param(head_), C_, config_.padded_vocab_size);
    }

    // Logits (B, T, Vp) of the last forward without targets, or (B, 1, Vp) of
    // forward_last; valid until release().
    TensorView<Act, D> logits() const { return pass_.logits(); }

    // Adds this pass's parameter gradients into gradients() and frees the
    // pass's activations.
    // `after` (optional) is called as each block's gradients become final.
    void backward(Context<D>& ctx, const std::int32_t* tokens, const AfterBlock& after = {}) {
        const Act* dnormed = pass_.begin_backward();
        const int B = pass_.B(), T = pass_.T();
        const std::int64_t N = std::int64_t{B} * T;
        const D& dev = ctx.device;
        auto& tmp = ctx.scratch;
        const auto scratch_mark = tmp.mark();
        // The head's backward ran in forward (classifier_loss); the final norm's is here.
        Act* dres = tmp.template push<Act>(N * C_, "d residual");
        Act* dother = tmp.template push<Act>(N * C_, "d residual (other)");
        fill_zero(dev, dres, N * C_);
        norm_.backward(dev, dres, dnormed, x_last_, N);
        // The head's activations go before the blocks' backward, which may recompute.
        pass_.release_head(ctx);
        dres = blocks_.backward(ctx, dres, dother, after);
        encoder_backward(dev, grad(embed_), positions_ >= 0 ? grad(positions_) : nullptr, dres, tokens, B, T, C_);
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
    // The embedding, the blocks and the final norm: returns the norm's output
    // (B T, C), in ctx.scratch (the head pops it); its statistics are kept.
    Act* forward_to_final_norm(Context<D>& ctx, const std::int32_t* tokens, int B, int T) {
        pass_.begin(ctx, B, T, config_.max_seq_len);
        const std::int64_t N = std::int64_t{B} * T;
        const D& dev = ctx.device;
        auto& a = ctx.activations;
        Act* x0 = a.template push<Act>(N * C_, "embedding");
        encoder_forward(dev, x0, tokens, param(embed_), positions_ >= 0 ? param(positions_) : nullptr, B, T, C_);
        x_last_ = blocks_.forward(ctx, TensorView<const Act, D>(x0, {B, T, C_})).data();
        pass_.mark_head(ctx);
        Act* normed = ctx.scratch.template push<Act>(N * C_, "final norm");
        norm_.forward(a, dev, normed, x_last_, N);
        return normed;
    }

    static Config validated(const Config& c) {
        auto bad = [](const std::string& what) { throw ConfigError("CausalLM config: " + what); };
        if (c.vocab_size <= 0) bad("vocab_size " + std::to_string(c.vocab_size) + " must be positive");
        if (c.padded_vocab_size < c.vocab_size)
            bad("padded_vocab_size " + std::to_string(c.padded_vocab_size) + " is smaller than vocab_size " +
                std::to_string(c.vocab_size));
        if (c.max_seq_len <= 0) bad("max_seq_len " + std::to_string(c.max_seq_len) + " must be positive");
        if (c.n_layer <= 0) bad("n_layer " + std::to_string(c.n_layer) + " must be positive");
        if (c.classifier_chunk < 0)
            bad("classifier_chunk " + std::to_string(c.classifier_chunk) + " must be 0 (automatic) or positive");
        const int C = Family::channels(c.block);
        if (C <= 0) bad("channels " + std::to_string(C) + " must be positive");
        if constexpr (!std::is_same_v<D, Host> && !std::is_same_v<D, Meter>) {
            // Every tensor starts at a multiple of C elements; GPU GEMMs need
            // 16-byte aligned operands.
            if (C % 8 != 0)
                bad("channels " + std::to_string(C) + " must be a multiple of 8 on " + std::string(D::name));
        }
        return c;
    }

    using FinalNorm = typename Family::template FinalNorm<Act, D>;

    // The family's final norm, with its settings where the family says them.
    static FinalNorm make_final_norm(ParameterRegistry& r, const Config& c) {
        if constexpr (requires { Family::template final_norm<Act, D>(r, std::string(), c.block); })
            return Family::template final_norm<Act, D>(r, "norm", c.block);
        else
            return FinalNorm(r, "norm", Family::channels(c.block));
    }

    static LayerStack<Block> make_blocks(ParameterRegistry& r, const Config& c) {
        std::vector<Block> blocks;
        blocks.reserve(static_cast<std::size_t>(c.n_layer));
        for (int l = 0; l < c.n_layer; ++l) blocks.emplace_back(r, "layers." + std::to_string(l) + ".", c.block);
        return LayerStack<Block>(std::move(blocks), "layers.");  // named as their tensors are
    }

    const Act* param(std::int64_t offset) const { return params_.data() + offset; }
    float* grad(std::int64_t offset) { return grads_.data() + offset; }

    // Declaration order is construction order: the registry fills up before
    // the buffers it sizes are allocated.
    Config config_;
    int C_;
    ParameterRegistry registry_;
    std::int64_t embed_;      // offsets into the buffers
    std::int64_t positions_;  // -1: no learned positions
    LayerStack<Block> blocks_;
    FinalNorm norm_;
    std::int64_t head_;  // == embed_ when tied
    Buffer<Act, D> params_;
    Buffer<float, D> grads_;
    // The pass in flight.
    LMPass<Act, D> pass_{"CausalLM"};
    Act* x_last_ = nullptr;  // (B, T, C) the last block's output
};

// What reports and FLOP counts need of a CausalLM of this config, counted on
// its Meter twin (nothing of its size allocated). Its matmul parameters: the
// head (V·C), every block's, and the final norm's C.
template <class Family>
ModelSummary model_summary(const CausalLMConfig<Family>& c) {
    MemoryTracker tracker;
    const CausalLM<Family, float, Meter> model(c, tracker);
    ModelSummary s;
    if constexpr (requires { Family::name; }) s.family = std::string(Family::name);
    s.layers = c.n_layer;
    if constexpr (requires { c.block.heads; }) s.heads = s.kv_heads = c.block.heads;
    if constexpr (requires { c.block.key_value_heads(); }) s.kv_heads = c.block.key_value_heads();
    s.channels = Family::channels(c.block);
    s.context = c.max_seq_len;
    s.vocab = c.vocab_size;
    if constexpr (requires { c.block.attention; }) s.attention = c.block.attention;
    s.parameters = model.num_parameters();
    for (const ParameterRange& r : model.block_parameters(0)) s.block_parameters += r.count;
    s.matmul_parameters = static_cast<double>(c.vocab_size) * s.channels +
                          static_cast<double>(c.n_layer) * static_cast<double>(s.block_parameters) + s.channels;
    return s;
}

template <class Family, class Act, DeviceTag D>
struct ModelOf<CausalLMConfig<Family>, Act, D> {
    using type = CausalLM<Family, Act, D>;
};

}  // namespace snug
