// CausalSelfAttention<Act, D, Position>: multi-head causal self-attention, a
// module (nn/module.hpp):
//   x (B, T, C) ─► qkv (C -> 3C, fused, rows [q | k | v]) ─► Position on q, k
//              ─► softmax(q k^T / sqrt(hs)) v per head ─► proj (C -> C) ─► out
// Tensors `name.qkv_proj.weight` (3C, C), `name.o_proj.weight` (C, C), and
// biases (3C), (C) with Bias::yes. forward keeps the (rotated) qkv and the
// heads' output on the arena it is given, and what its attention kind needs:
// one log-sum-exp per row (flash, the default, or cuDNN's fused engine:
// nn/attention.hpp) or the (B, NH, T, T) probabilities (AttentionKind::materialized).
//
// Position is the position-encoding hook, applied to q and k inside the
// fused qkv and undone on their gradients: NoPosition (GPT-2 adds learned
// positions to the embedding instead) or RoPE (rotary, Llama's). A user's own
// encoding is a type with the same two members.
#pragma once

#include <cstdint>
#include <string>

#include "snug/core/arena.hpp"
#include "snug/core/device.hpp"
#include "snug/nn/attention.hpp"
#include "snug/nn/attention_kind.hpp"
#include "snug/nn/linear.hpp"
#include "snug/nn/module.hpp"
#include "snug/nn/parameters.hpp"
#include "snug/ops/kernels.hpp"

namespace snug {

// No position encoding inside attention.
struct NoPosition {
    template <class Dev, class Act>
    void forward(const Dev&, Act* /*qkv (B, T, 3C)*/, int /*B*/, int /*T*/, int /*NH*/, int /*hs*/) const {}
    template <class Dev, class Act>
    void backward(const Dev&, Act* /*dqkv (B, T, 3C)*/, int /*B*/, int /*T*/, int /*NH*/, int /*hs*/) const {}
};

// Rotary position embedding (ops/rope.hpp) of q and k, in place in the fused
// qkv: the first 2 NH heads of each row of 3 NH.
struct RoPE {
    double theta = ops::rope_theta;

    template <class Dev, class Act>
    void forward(const Dev& dev, Act* qkv /*(B, T, 3C)*/, int B, int T, int NH, int hs) const {
        rope_forward(dev, qkv, qkv, B, T, 2 * NH, hs, theta, 0, std::int64_t{3} * NH * hs);
    }
    template <class Dev, class Act>
    void backward(const Dev& dev, Act* dqkv /*(B, T, 3C)*/, int B, int T, int NH, int hs) const {
        rope_backward(dev, dqkv, dqkv, B, T, 2 * NH, hs, theta, 0, std::int64_t{3} * NH * hs);
    }
};

template <class Act, DeviceTag D, class Position = NoPosition>
class CausalSelfAttention {
public:
    CausalSelfAttention(ParameterRegistry& r, const std::string& name, int channels, int heads, Bias bias = Bias::no,
                        Position position = {}, Init proj_init = Init::normal(0.02f),
                        AttentionKind attention = AttentionKind::flash)
        : C_(channels),
          NH_(heads),
          attention_(attention),
          position_(position),
          qkv_(r, name + ".qkv_proj", channels, 3 * channels, bias),
          proj_(r, name + ".o_proj", channels, channels, bias, proj_init) {
        if (heads <= 0 || channels % heads != 0)
            throw ShapeError("CausalSelfAttention '" + name + "': channels " + std::to_string(channels) +
                             " must be a positive multiple of heads " + std::to_string(heads));
    }

    void bind(ParameterBinding<Act> b) {
        qkv_.bind(b);
        proj_.bind(b);
    }

    void forward(ActivationArena<D>& keep, const D& dev, Act* out /*(B, T, C)*/, const Act* in /*(B, T, C)*/, int B,
                 int T) {
        B_ = B;
        T_ = T;
        const std::int64_t N = std::int64_t{B} * T;
        qkv_out_ = keep.template push<Act>(N * 3 * C_, "qkv");
        qkv_.forward(dev, qkv_out_, in, N);
        position_.forward(dev, qkv_out_, B, T, NH_, C_ / NH_);
        if (attention_ != AttentionKind::materialized) {
            lse_ = keep.template push<Stat>(ops::flash_stat_elems(B, T, NH_), "attention log-sum-exp");
            heads_ = keep.template push<Act>(N * C_, "attention output");
            // (A fused engine's forward workspace, if any, is pushed on `keep` and popped at once.)
            flash_or_fused_forward(attention_, keep, dev, heads_, lse_, qkv_out_, B, T, C_, NH_);
        } else {
            att_ = keep.template push<Act>(att_elems(), "attention probabilities");
            heads_ = keep.template push<Act>(N * C_, "attention output");
            attention_forward(dev, heads_, att_, qkv_out_, B, T, C_, NH_);
        }
        proj_.forward(dev, out, heads_, N);
    }

    // din (B, T, C) overwritten.
    void backward(ActivationArena<D>& scratch, const D& dev, Act* din /*(B, T, C)*/, const Act* dout /*(B, T, C)*/,
                  const Act* in /*(B, T, C)*/) const {
        const std::int64_t N = std::int64_t{B_} * T_;
        const auto mark = scratch.mark();
        Act* dheads = scratch.template push<Act>(N * C_, "d attention output");
        proj_.backward(dev, dheads, dout, heads_, N);
        Act* dqkv = scratch.template push<Act>(N * 3 * C_, "d qkv");
        if (attention_ != AttentionKind::materialized) {
            flash_or_fused_backward(attention_, scratch, dev, dqkv, dheads, qkv_out_, heads_, lse_, B_, T_, C_, NH_);
        } else {
            Act* datt = scratch.template push<Act>(att_elems(), "d attention");
            attention_backward(dev, dqkv, datt, dheads, qkv_out_, att_, B_, T_, C_, NH_);
        }
        position_.backward(dev, dqkv, B_, T_, NH_, C_ / NH_);
        qkv_.backward(dev, din, dqkv, in, N);
        scratch.release_to(mark);
    }

private:
    using Stat = ops::flash_stat_t<Act>;  // flash attention's per-row statistics

    std::int64_t att_elems() const { return std::int64_t{B_} * NH_ * T_ * T_; }

    int C_, NH_;
    AttentionKind attention_;
    Position position_;
    Linear<Act, D> qkv_, proj_;
    int B_ = 0, T_ = 0;
    Act* qkv_out_ = nullptr;  // (B, T, 3C) after Position
    Act* att_ = nullptr;      // (B, NH, T, T) materialised attention only
    Stat* lse_ = nullptr;     // (B, NH, T) flash attention only
    Act* heads_ = nullptr;    // (B, T, C)
};

}  // namespace snug
