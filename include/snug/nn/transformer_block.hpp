// TransformerBlock<Act, D>: one pre-LayerNorm GPT-2 block, a Layer.
//   x ─► ln1 ─► qkv ─► attention ─► c_proj ─(+x)─► r ─► ln2 ─► fc ─► gelu ─► fc_proj ─(+r)─► out
// Forward saves every intermediate in ctx.activations; backward uses them and
// releases them, the MLP's before attention's backward starts; its own
// temporaries live in ctx.scratch (one MLP hidden gradient, then d qkv: the
// gradient of fc's output overwrites fc's output, its last use). Attention is flash
// attention (saving its output and one log-sum-exp per row; on cuDNN's fused
// engine with AttentionKind::cudnn where it takes the call, nn/attention.hpp)
// or, when asked, the materialised kernel (saving the (B, NH, T, T) probabilities).
#pragma once

#include <cstdint>

#include "snug/core/tensor.hpp"
#include "snug/nn/attention.hpp"
#include "snug/nn/attention_kind.hpp"
#include "snug/nn/context.hpp"
#include "snug/nn/layer.hpp"
#include "snug/ops/kernels.hpp"

namespace snug {

// Pointers to one block's tensors (weights, or their fp32 gradients).
template <class P>
struct BlockTensors {
    P* ln1w;      // (C)
    P* ln1b;      // (C)
    P* qkvw;      // (3C, C)
    P* qkvb;      // (3C)
    P* attprojw;  // (C, C)
    P* attprojb;  // (C)
    P* ln2w;      // (C)
    P* ln2b;      // (C)
    P* fcw;       // (4C, C)
    P* fcb;       // (4C)
    P* fcprojw;   // (C, 4C)
    P* fcprojb;   // (C)
};

//   Act: activation and working-weight type (float, bfloat16, half)
//   D: device tag
template <class Act, DeviceTag D>
class TransformerBlock {
public:
    using value_type = Act;
    using device_type = D;

    TransformerBlock(int channels, int heads, BlockTensors<const Act> weights, BlockTensors<float> grads,
                     AttentionKind attention = AttentionKind::flash)
        : C_(channels), NH_(heads), attention_(attention), w_(weights), g_(grads) {
        if (channels <= 0 || heads <= 0 || channels % heads != 0)
            throw ShapeError("TransformerBlock: channels " + std::to_string(channels) +
                             " must be a positive multiple of heads " + std::to_string(heads));
    }

    Shape output_shape(const Shape& in) const { return in; }

    void set_selective(bool on) { selective_ = on; }
    bool selective() const { return selective_; }

    void forward(Context<D>& ctx, TensorView<const Act, D> x /*(B,T,C)*/, TensorView<Act, D> out /*(B,T,C)*/) {
        check_input(x);
        expect_shape(out, x.shape(), "TransformerBlock output");
        B_ = static_cast<int>(x.size(0));
        T_ = static_cast<int>(x.size(1));
        const std::int64_t N = std::int64_t{B_} * T_;
        const D& dev = ctx.device;
        auto& a = ctx.activations;
        mark_ = a.mark();
        // Kept tensors go to the activation arena; in selective mode the ones
        // backward recomputes live in the scratch arena only while needed.
        auto& dropped = selective_ ? ctx.scratch : a;
        const auto scratch_mark = ctx.scratch.mark();

        push_ln(dropped, N, s_.ln1, s_.ln1_mean, s_.ln1_rstd, "ln1");
        layernorm_forward(dev, s_.ln1, s_.ln1_mean, s_.ln1_rstd, x.data(), w_.ln1w, w_.ln1b, N, C_);
        s_.qkv = a.template push<Act>(N * 3 * C_, "qkv");
        linear_forward(dev, s_.qkv, s_.ln1, w_.qkvw, w_.qkvb, N, C_, 3 * C_);
        if (selective_) ctx.scratch.release_to(scratch_mark);

        if (attention_ != AttentionKind::materialized) {  // nothing T x T to drop: selective keeps it all
            s_.lse = a.template push<Stat>(stat_elems(), "attention log-sum-exp");
            s_.atty = a.template push<Act>(N * C_, "attention output");
            flash_or_fused_forward(attention_, ctx.scratch, dev, s_.atty, s_.lse, s_.qkv, B_, T_, C_, NH_, NH_);
        } else {
            s_.att = dropped.template push<Act>(att_elems(), "attention probabilities");
            s_.atty = a.template push<Act>(N * C_, "attention output");
            attention_forward(dev, s_.atty, s_.att, s_.qkv, B_, T_, C_, NH_);
            if (selective_) ctx.scratch.release_to(scratch_mark);
        }

        mlp_mark_ = a.mark();  // what the MLP's backward is the last to need lies above
        s_.res = a.template push<Act>(N * C_, "residual 2");
        linear_forward(dev, s_.res, s_.atty, w_.attprojw, w_.attprojb, N, C_, C_);

        push_ln(dropped, N, s_.ln2, s_.ln2_mean, s_.ln2_rstd, "ln2");
        // r = x + c_proj(...) and ln2(r) in one pass over r and x.
        residual_layernorm_forward(dev, s_.ln2, s_.ln2_mean, s_.ln2_rstd, s_.res, x.data(), w_.ln2w, w_.ln2b, N, C_);
        s_.fch = a.template push<Act>(N * 4 * C_, "mlp hidden");
        linear_forward(dev, s_.fch, s_.ln2, w_.fcw, w_.fcb, N, C_, 4 * C_);
        if (selective_) ctx.scratch.release_to(scratch_mark);

        s_.fch_gelu = dropped.template push<Act>(N * 4 * C_, "mlp gelu");
        gelu_forward(dev, s_.fch_gelu, s_.fch, N * 4 * C_);
        linear_forward(dev, out.data(), s_.fch_gelu, w_.fcprojw, w_.fcprojb, N, 4 * C_, C_);
        add_inplace(dev, out.data(), s_.res, N * C_);
        if (selective_) ctx.scratch.release_to(scratch_mark);
    }

    void backward(Context<D>& ctx, TensorView<const Act, D> x /*(B,T,C)*/, TensorView<const Act, D> dout /*(B,T,C)*/,
                  TensorView<Act, D> dx /*(B,T,C)*/) {
        check_input(x);
        expect_shape(dout, x.shape(), "TransformerBlock output gradient");
        expect_shape(dx, x.shape(), "TransformerBlock input gradient");
        const std::int64_t N = std::int64_t{B_} * T_;
        const D& dev = ctx.device;
        auto& tmp = ctx.scratch;
        const auto scratch_mark = tmp.mark();

        // MLP: out = r + fc_proj(gelu(fc(ln2(r)))). dx holds d r, then d x.
        if (selective_) recompute_mlp(ctx);
        copy(dev, dx.data(), dout.data(), N * C_);
        Act* dh = tmp.template push<Act>(N * 4 * C_, "d mlp hidden");
        linear_backward(dev, dh, g_.fcprojw, g_.fcprojb, dout.data(), s_.fch_gelu, w_.fcprojw, N, 4 * C_, C_);
        Act* dfch = s_.fch;  // d fc out, in place of fc out (its last use)
        gelu_backward(dev, dfch, s_.fch, dh, N * 4 * C_);
        tmp.pop(dh);
        Act* dln = tmp.template push<Act>(N * C_, "d layernorm out");
        linear_backward(dev, dln, g_.fcw, g_.fcb, dfch, s_.ln2, w_.fcw, N, C_, 4 * C_);
        layernorm_backward(dev, dx.data(), g_.ln2w, g_.ln2b, dln, s_.res, w_.ln2w, s_.ln2_mean, s_.ln2_rstd, N, C_);
        // The MLP's activations (r, ln2, fc out, gelu out) go before attention's backward.
        ctx.activations.release_to(mlp_mark_);

        // Attention: r = x + c_proj(attention(qkv(ln1(x))))
        if (selective_) recompute_attention(ctx, x);
        Act* datty = dln;  // (N, C), free again
        linear_backward(dev, datty, g_.attprojw, g_.attprojb, dx.data(), s_.atty, w_.attprojw, N, C_, C_);
        Act* dqkv = tmp.template push<Act>(N * 3 * C_, "d qkv");
        if (attention_ != AttentionKind::materialized) {
            flash_or_fused_backward(attention_, tmp, dev, dqkv, datty, s_.qkv, s_.atty, s_.lse, B_, T_, C_, NH_, NH_);
        } else {
            Act* att_scratch = tmp.template push<Act>(att_elems(), "d attention");
            attention_backward(dev, dqkv, att_scratch, datty, s_.qkv, s_.att, B_, T_, C_, NH_);
        }
        Act* dln1 = datty;  // (N, C), free again
        linear_backward(dev, dln1, g_.qkvw, g_.qkvb, dqkv, s_.ln1, w_.qkvw, N, C_, 3 * C_);
        layernorm_backward(dev, dx.data(), g_.ln1w, g_.ln1b, dln1, x.data(), w_.ln1w, s_.ln1_mean, s_.ln1_rstd, N,
                           C_);

        tmp.release_to(scratch_mark);
        ctx.activations.release_to(mark_);
    }

private:
    using Stat = ops::flash_stat_t<Act>;  // flash attention's per-row statistics

    std::int64_t att_elems() const { return std::int64_t{B_} * NH_ * T_ * T_; }
    std::int64_t stat_elems() const { return ops::flash_stat_elems(B_, T_, NH_); }

    template <class Arena>
    void push_ln(Arena& arena, std::int64_t N, Act*& out, float*& mean, float*& rstd, const char* what) {
        out = arena.template push<Act>(N * C_, what);
        mean = arena.template push<float>(N, "layernorm mean");
        rstd = arena.template push<float>(N, "layernorm rstd");
    }

    // Selective mode: rebuilds what forward dropped onto the activation arena,
    // each part just before its backward: the MLP's (gelu out, ln2; released
    // with the MLP's activations), then attention's (the probabilities when
    // materialised, ln1; released with the rest of the block's).
    void recompute_mlp(Context<D>& ctx) {
        const std::int64_t N = std::int64_t{B_} * T_;
        const D& dev = ctx.device;
        auto& a = ctx.activations;
        s_.fch_gelu = a.template push<Act>(N * 4 * C_, "mlp gelu (recomputed)");
        gelu_forward(dev, s_.fch_gelu, s_.fch, N * 4 * C_);
        push_ln(a, N, s_.ln2, s_.ln2_mean, s_.ln2_rstd, "ln2 (recomputed)");
        layernorm_forward(dev, s_.ln2, s_.ln2_mean, s_.ln2_rstd, s_.res, w_.ln2w, w_.ln2b, N, C_);
    }

    void recompute_attention(Context<D>& ctx, const TensorView<const Act, D>& x) {
        const std::int64_t N = std::int64_t{B_} * T_;
        const D& dev = ctx.device;
        auto& a = ctx.activations;
        if (attention_ == AttentionKind::materialized) {
            s_.att = a.template push<Act>(att_elems(), "attention probabilities (recomputed)");
            Act* atty = ctx.scratch.template push<Act>(N * C_, "attention output (recomputed, unused)");
            attention_forward(dev, atty, s_.att, s_.qkv, B_, T_, C_, NH_);
            ctx.scratch.pop(atty);
        }
        push_ln(a, N, s_.ln1, s_.ln1_mean, s_.ln1_rstd, "ln1 (recomputed)");
        layernorm_forward(dev, s_.ln1, s_.ln1_mean, s_.ln1_rstd, x.data(), w_.ln1w, w_.ln1b, N, C_);
    }

    void check_input(const TensorView<const Act, D>& x) const {
        if (x.rank() != 3 || x.size(2) != C_)
            throw ShapeError("TransformerBlock input: expected (B, T, " + std::to_string(C_) + "), got " +
                             x.shape().str());
    }

    // What forward saved for backward (pointers into ctx.activations).
    struct Saved {
        Act* ln1;         // (N, C)
        float* ln1_mean;  // (N)
        float* ln1_rstd;  // (N)
        Act* qkv;         // (N, 3C)
        Act* att;         // (B, NH, T, T) materialised attention only
        Stat* lse;        // (B, NH, T) flash attention only
        Act* atty;        // (N, C)
        Act* res;         // (N, C) x + attention branch
        Act* ln2;         // (N, C)
        float* ln2_mean;  // (N)
        float* ln2_rstd;  // (N)
        Act* fch;         // (N, 4C)
        Act* fch_gelu;    // (N, 4C)
    };

    int C_, NH_;
    AttentionKind attention_;
    BlockTensors<const Act> w_;
    BlockTensors<float> g_;
    int B_ = 0, T_ = 0;
    bool selective_ = false;
    Saved s_{};
    typename ActivationArena<D>::Mark mark_{};
    typename ActivationArena<D>::Mark mlp_mark_{};  // before r: the MLP part's activations
};

}  // namespace snug
