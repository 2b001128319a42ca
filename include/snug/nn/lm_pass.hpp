// LMPass<Act, D>: one pass of a causal language model through its output
// head, the part GPT and CausalLM share: which pass is in flight (training,
// to be finished by backward; or evaluation / sampling, by release), the
// arena marks that undo it, and the head itself — the chunked loss
// (nn/classifier.hpp), the whole logits when there are no targets, the last
// position's for sampling. A model runs its embedding, blocks and final norm
// between begin() and one of the head calls, and its own backward between
// begin_backward() and end_backward().
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "snug/core/error.hpp"
#include "snug/core/tensor.hpp"
#include "snug/nn/classifier.hpp"
#include "snug/nn/context.hpp"

namespace snug {

template <class Act, DeviceTag D>
class LMPass {
public:
    // `model` names the model in error messages ("GPT", "CausalLM").
    explicit LMPass(const char* model) : model_(model) {}

    // Starts a pass over tokens (B, T): no pass in flight, B > 0, 0 < T <=
    // max_seq_len. Marks both arenas: what is pushed from here on belongs to
    // the pass.
    void begin(Context<D>& ctx, int B, int T, int max_seq_len) {
        if (pending_ != Pending::none)
            throw Error(who("forward") + "the previous pass was not finished (call backward() or release())");
        if (B <= 0 || T <= 0)
            throw ShapeError(who("forward") + "B = " + std::to_string(B) + " and T = " + std::to_string(T) +
                             " must both be positive");
        if (T > max_seq_len)
            throw ShapeError(who("forward") + "sequences of T = " + std::to_string(T) +
                             " tokens are longer than the model's context, max_seq_len = " +
                             std::to_string(max_seq_len) + ": pass at most " + std::to_string(max_seq_len) +
                             " tokens, or build the model with a larger max_seq_len in its config (train_gpt: "
                             "--seq sets a fresh model's context)");
        B_ = B;
        T_ = T;
        mark_ = ctx.activations.mark();
        scratch_mark_ = ctx.scratch.mark();
    }

    // Before begin(), so that nothing runs: a training pass (dloss != 0) needs targets.
    void check_forward(const std::int32_t* targets, float dloss) const {
        if (dloss != 0.0f && targets == nullptr)
            throw Error(who("forward") + "a training pass (dloss != 0) needs targets");
    }

    // After the blocks: the activations pushed from here on (the final norm's,
    // the head's) go before the blocks' backward, which may recompute.
    void mark_head(Context<D>& ctx) { head_mark_ = ctx.activations.mark(); }

    // The head over the final norm's output normed (B T, C) in ctx.scratch,
    // through weight (Vp, C). With targets: the mean loss, or NaN with the
    // token losses added to loss_sum (device memory) when it is given; with
    // dloss != 0 the head's backward runs too (dweight (Vp, C) accumulates, d
    // normed is kept for backward) and backward must follow, otherwise
    // release. normed is popped. Without targets: the logits (B, T, Vp) whole,
    // readable through logits() until release(), and NaN. A failure (a bad
    // target on the host, no memory) undoes the pass, gradients untouched.
    float head(Context<D>& ctx, Act* normed, const Act* weight, float* dweight, const std::int32_t* targets,
               float dloss, double* loss_sum, int C, int V, int Vp, std::int64_t chunk_rows) {
        if (dloss != 0.0f && targets == nullptr) {  // a model that did not check_forward() first
            undo(ctx);
            check_forward(targets, dloss);
        }
        const std::int64_t N = std::int64_t{B_} * T_;
        auto& a = ctx.activations;
        pending_ = dloss != 0.0f ? Pending::backward : Pending::release;
        if (targets == nullptr) {
            logits_ = a.template push<Act>(N * Vp, "logits");
            logits_rows_ = T_;
            Vp_ = Vp;
            linear_forward(ctx.device, logits_, normed, weight, static_cast<const Act*>(nullptr), N, C, Vp);
            return std::numeric_limits<float>::quiet_NaN();
        }
        float loss = 0.0f;
        try {
            if (dloss != 0.0f) dnormed_ = a.template push<Act>(N * C, "d final norm (from the head)");
            loss = classifier_loss(ctx, dnormed_, dloss != 0.0f ? dweight : nullptr, normed, weight, targets, N, C, V,
                                   Vp, dloss, chunk_rows, loss_sum);
        } catch (...) {
            undo(ctx);
            throw;
        }
        ctx.scratch.pop(normed);
        return loss;
    }

    // Only each sequence's last logits (B, 1, Vp) from normed (B T, C),
    // readable through logits() until release(): what sampling needs.
    void head_last(Context<D>& ctx, const Act* normed, const Act* weight, int C, int Vp) {
        pending_ = Pending::release;
        logits_ = ctx.activations.template push<Act>(std::int64_t{B_} * Vp, "last logits");
        logits_rows_ = 1;
        Vp_ = Vp;
        last_position_logits(ctx.device, logits_, normed, weight, B_, T_, C, Vp);
    }

    // Logits (B, T, Vp) of the last pass without targets, or (B, 1, Vp) of
    // head_last; valid until release().
    TensorView<Act, D> logits() const {
        if (pending_ == Pending::none || logits_ == nullptr)
            throw Error(who("logits") + "no forward pass without targets is in progress");
        return {logits_, {B_, logits_rows_, Vp_}};
    }

    // Starts the model's backward of a training pass; returns d normed (B T,
    // C), the head's gradient of the final norm's output.
    const Act* begin_backward() const {
        if (pending_ != Pending::backward)
            throw Error(who("backward") + "needs a preceding forward() with targets and dloss != 0");
        return dnormed_;
    }
    // Frees the final norm's and the head's activations (after the norm's backward).
    void release_head(Context<D>& ctx) { ctx.activations.release_to(head_mark_); }
    // Frees the pass's activations: backward is done.
    void end_backward(Context<D>& ctx) {
        ctx.activations.release_to(mark_);
        end();
    }

    // Ends a pass that is not followed by backward (evaluation, sampling).
    void release(Context<D>& ctx) {
        if (pending_ == Pending::none) return;
        if (pending_ == Pending::backward)
            throw Error(who("release") + "this forward pass was a training pass; call backward()");
        undo(ctx);
    }

    int B() const { return B_; }
    int T() const { return T_; }

private:
    enum class Pending { none, backward, release };

    std::string who(const char* what) const { return std::string(model_) + "::" + what + ": "; }
    void undo(Context<D>& ctx) {
        ctx.scratch.release_to(scratch_mark_);
        ctx.activations.release_to(mark_);
        end();
    }
    void end() {
        pending_ = Pending::none;
        dnormed_ = logits_ = nullptr;
    }

    const char* model_;
    Pending pending_ = Pending::none;
    int B_ = 0, T_ = 0, Vp_ = 0;
    typename ActivationArena<D>::Mark mark_{};       // before the embedding
    typename ActivationArena<D>::Mark head_mark_{};  // before the final norm's and the head's activations
    typename ActivationArena<D>::Mark scratch_mark_{};
    Act* dnormed_ = nullptr;  // (B, T, C) training: d loss / d normed, from the head
    Act* logits_ = nullptr;   // (B, logits_rows_, Vp) without targets
    int logits_rows_ = 0;
};

}  // namespace snug
