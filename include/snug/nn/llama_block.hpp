// LlamaBlock<Act, D>: one pre-norm Llama decoder block, a Layer composed of
// the modules of nn/:
//   x ─► RMSNorm ─► CausalSelfAttention<RoPE> ─(+x)─► r ─► RMSNorm ─► SwiGLUMLP ─(+r)─► out
// (attention with grouped queries where kv_heads < heads: Llama 2 70B's,
// Llama 3's, Mistral's)
// Its tensors, under `prefix` (e.g. "layers.3."): input_layernorm.weight,
// self_attn.{qkv_proj,o_proj}.weight, post_attention_layernorm.weight,
// mlp.{gate_up_proj,down_proj}.weight — Hugging Face Llama's names, with q, k,
// v and gate, up fused. Forward keeps its activations on ctx.activations
// until backward, which releases them; backward's temporaries live in
// ctx.scratch. Inside a LayerStack it can be checkpointed (Recompute::full).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "snug/core/tensor.hpp"
#include "snug/nn/causal_self_attention.hpp"
#include "snug/nn/context.hpp"
#include "snug/nn/layer.hpp"
#include "snug/nn/module.hpp"
#include "snug/nn/parameters.hpp"
#include "snug/nn/rmsnorm.hpp"
#include "snug/nn/swiglu_mlp.hpp"
#include "snug/ops/kernels.hpp"

namespace snug {

// The sizes a Llama block needs.
struct LlamaBlockShape {
    int channels;                      // C
    int heads;                         // NH, C % NH == 0, C / NH even (RoPE)
    int kv_heads = 0;                  // key/value heads, NH a multiple (grouped-query attention); 0: NH
    int hidden;                        // the MLP's H
    int layers = 1;                    // of the whole stack: scales the residual projections' init
    double rope_theta = ops::rope_theta;
    double norm_eps = ops::rmsnorm_eps;
    AttentionKind attention = AttentionKind::flash;

    int key_value_heads() const { return kv_heads > 0 ? kv_heads : heads; }
};

template <class Act, DeviceTag D>
class LlamaBlock {
public:
    using value_type = Act;
    using device_type = D;

    LlamaBlock(ParameterRegistry& r, const std::string& prefix, const LlamaBlockShape& s)
        : C_(s.channels),
          norm1_(r, prefix + "input_layernorm", s.channels, s.norm_eps),
          attn_(r, prefix + "self_attn", s.channels, s.heads, s.key_value_heads(), Bias::no, RoPE{s.rope_theta},
                residual_init(s), s.attention),
          norm2_(r, prefix + "post_attention_layernorm", s.channels, s.norm_eps),
          mlp_(r, prefix + "mlp", s.channels, s.hidden, residual_init(s)) {
        if ((s.channels / s.heads) % 2 != 0)
            throw ShapeError("LlamaBlock: head size " + std::to_string(s.channels / s.heads) +
                             " (channels / heads) must be even for rotary embeddings");
    }

    void bind(ParameterBinding<Act> b) {
        norm1_.bind(b);
        attn_.bind(b);
        norm2_.bind(b);
        mlp_.bind(b);
    }

    Shape output_shape(const Shape& in) const { return in; }

    void forward(Context<D>& ctx, TensorView<const Act, D> x /*(B,T,C)*/, TensorView<Act, D> out /*(B,T,C)*/) {
        check_input(x);
        expect_shape(out, x.shape(), "LlamaBlock output");
        const int B = static_cast<int>(x.size(0)), T = static_cast<int>(x.size(1));
        N_ = std::int64_t{B} * T;
        const D& dev = ctx.device;
        auto& a = ctx.activations;
        mark_ = a.mark();
        n1_ = a.template push<Act>(N_ * C_, "input norm");
        norm1_.forward(a, dev, n1_, x.data(), N_);
        r_ = a.template push<Act>(N_ * C_, "residual 2");
        attn_.forward(a, dev, r_, n1_, B, T);
        add_inplace(dev, r_, x.data(), N_ * C_);
        n2_ = a.template push<Act>(N_ * C_, "post-attention norm");
        norm2_.forward(a, dev, n2_, r_, N_);
        mlp_.forward(a, dev, out.data(), n2_, N_);
        add_inplace(dev, out.data(), r_, N_ * C_);
    }

    void backward(Context<D>& ctx, TensorView<const Act, D> x /*(B,T,C)*/, TensorView<const Act, D> dout /*(B,T,C)*/,
                  TensorView<Act, D> dx /*(B,T,C)*/) {
        check_input(x);
        expect_shape(dout, x.shape(), "LlamaBlock output gradient");
        expect_shape(dx, x.shape(), "LlamaBlock input gradient");
        const D& dev = ctx.device;
        auto& tmp = ctx.scratch;
        const auto scratch_mark = tmp.mark();
        // out = r + mlp(norm2(r))
        Act* dn = tmp.template push<Act>(N_ * C_, "d norm output");
        mlp_.backward(tmp, dev, dn, dout.data(), n2_, N_);
        Act* dr = tmp.template push<Act>(N_ * C_, "d residual 2");
        copy(dev, dr, dout.data(), N_ * C_);
        norm2_.backward(dev, dr, dn, r_, N_);
        // r = x + attention(norm1(x))
        attn_.backward(tmp, dev, dn, dr, n1_);
        copy(dev, dx.data(), dr, N_ * C_);
        norm1_.backward(dev, dx.data(), dn, x.data(), N_);
        tmp.release_to(scratch_mark);
        ctx.activations.release_to(mark_);
    }

private:
    // GPT-2's rule for the projections into the residual stream: std
    // 0.02 / sqrt(2 L).
    static Init residual_init(const LlamaBlockShape& s) {
        return Init::normal(0.02f / std::sqrt(2.0f * static_cast<float>(s.layers)));
    }

    void check_input(const TensorView<const Act, D>& x) const {
        if (x.rank() != 3 || x.size(2) != C_)
            throw ShapeError("LlamaBlock input: expected (B, T, " + std::to_string(C_) + "), got " + x.shape().str());
    }

    int C_;
    RMSNorm<Act, D> norm1_;
    CausalSelfAttention<Act, D, RoPE> attn_;
    RMSNorm<Act, D> norm2_;
    SwiGLUMLP<Act, D> mlp_;
    std::int64_t N_ = 0;
    Act* n1_ = nullptr;  // (N, C) norm1(x)
    Act* r_ = nullptr;   // (N, C) x + attention
    Act* n2_ = nullptr;  // (N, C) norm2(r)
    typename ActivationArena<D>::Mark mark_{};
};

}  // namespace snug
