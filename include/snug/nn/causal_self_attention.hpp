// CausalSelfAttention<Act, D, Position>: multi-head causal self-attention, a
// module (nn/module.hpp):
//   x (B, T, C) ─► qkv (C -> C + 2 KV hs, fused, rows [q | k | v]) ─► Position on q, k
//              ─► softmax(q k^T / sqrt(hs)) v per head ─► proj (C -> C) ─► out
// with NH query heads of hs = C / NH channels and KV key/value heads, each
// shared by NH / KV query heads (grouped-query attention; KV = NH is plain
// multi-head attention, qkv 3C wide). Tensors `name.qkv_proj.weight`
// (C + 2 KV hs, C), `name.o_proj.weight` (C, C), and biases with Bias::yes.
// Grouped queries run on the flash kernels (not the materialized kernel). forward keeps the (rotated) qkv and the
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
    void forward(const Dev&, Act* /*qkv (B, T, C + 2 KV hs)*/, int /*B*/, int /*T*/, int /*NH*/, int /*KV*/,
                 int /*hs*/) const {}
    template <class Dev, class Act>
    void backward(const Dev&, Act* /*dqkv (B, T, C + 2 KV hs)*/, int /*B*/, int /*T*/, int /*NH*/, int /*KV*/,
                  int /*hs*/) const {}
};

// Rotary position embedding (ops/rope.hpp) of q and k, in place in the fused
// qkv: the first NH + KV heads (the queries', then the keys') of each row of
// NH + 2 KV heads.
struct RoPE {
    double theta = ops::rope_theta;

    template <class Dev, class Act>
    void forward(const Dev& dev, Act* qkv /*(B, T, C + 2 KV hs)*/, int B, int T, int NH, int KV, int hs) const {
        rope_forward(dev, qkv, qkv, B, T, NH + KV, hs, theta, 0, std::int64_t{NH + 2 * KV} * hs);
    }
    template <class Dev, class Act>
    void backward(const Dev& dev, Act* dqkv /*(B, T, C + 2 KV hs)*/, int B, int T, int NH, int KV, int hs) const {
        rope_backward(dev, dqkv, dqkv, B, T, NH + KV, hs, theta, 0, std::int64_t{NH + 2 * KV} * hs);
    }
};

template <class Act, DeviceTag D, class Position = NoPosition>
class CausalSelfAttention {
public:
    // kv_heads: KV, heads a multiple of it (heads for multi-head attention).
    CausalSelfAttention(ParameterRegistry& r, const std::string& name, int channels, int heads, int kv_heads,
                        Bias bias = Bias::no, Position position = {}, Init proj_init = Init::normal(0.02f),
                        AttentionKind attention = AttentionKind::flash)
        : C_(checked_channels(name, channels, heads, kv_heads, attention)),
          NH_(heads),
          KV_(kv_heads),
          attention_(attention),
          position_(position),
          qkv_(r, name + ".qkv_proj", channels, qkv_width(), bias),
          proj_(r, name + ".o_proj", channels, channels, bias, proj_init) {}

    void bind(ParameterBinding<Act> b) {
        qkv_.bind(b);
        proj_.bind(b);
    }

    void forward(ActivationArena<D>& keep, const D& dev, Act* out /*(B, T, C)*/, const Act* in /*(B, T, C)*/, int B,
                 int T) {
        B_ = B;
        T_ = T;
        const std::int64_t N = std::int64_t{B} * T;
        qkv_out_ = keep.template push<Act>(N * qkv_width(), "qkv");
        qkv_.forward(dev, qkv_out_, in, N);
        position_.forward(dev, qkv_out_, B, T, NH_, KV_, C_ / NH_);
        if (attention_ != AttentionKind::materialized) {
            lse_ = keep.template push<Stat>(ops::flash_stat_elems(B, T, NH_), "attention log-sum-exp");
            heads_ = keep.template push<Act>(N * C_, "attention output");
            // (A fused engine's forward workspace, if any, is pushed on `keep` and popped at once.)
            flash_or_fused_forward(attention_, keep, dev, heads_, lse_, qkv_out_, B, T, C_, NH_, KV_);
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
        Act* dqkv = scratch.template push<Act>(N * qkv_width(), "d qkv");
        if (attention_ != AttentionKind::materialized) {
            flash_or_fused_backward(attention_, scratch, dev, dqkv, dheads, qkv_out_, heads_, lse_, B_, T_, C_, NH_,
                                    KV_);
        } else {
            Act* datt = scratch.template push<Act>(att_elems(), "d attention");
            attention_backward(dev, dqkv, datt, dheads, qkv_out_, att_, B_, T_, C_, NH_);
        }
        position_.backward(dev, dqkv, B_, T_, NH_, KV_, C_ / NH_);
        qkv_.backward(dev, din, dqkv, in, N);
        scratch.release_to(mark);
    }

private:
    using Stat = ops::flash_stat_t<Act>;  // flash attention's per-row statistics

    std::int64_t att_elems() const { return std::int64_t{B_} * NH_ * T_ * T_; }
    int qkv_width() const { return static_cast<int>(ops::qkv_width(C_, NH_, KV_)); }

    // channels, once heads and kv_heads are checked (ShapeError naming them).
    static int checked_channels(const std::string& name, int channels, int heads, int kv_heads,
                                AttentionKind attention) {
        const std::string who = "CausalSelfAttention '" + name + "': ";
        if (heads <= 0 || channels % heads != 0)
            throw ShapeError(who + "channels " + std::to_string(channels) + " must be a positive multiple of heads " +
                             std::to_string(heads));
        if (kv_heads <= 0 || heads % kv_heads != 0)
            throw ShapeError(who + "heads " + std::to_string(heads) + " must be a multiple of key/value heads " +
                             std::to_string(kv_heads));
        if (kv_heads != heads && attention == AttentionKind::materialized)
            throw ShapeError(who + "grouped-query attention (" + std::to_string(kv_heads) +
                             " key/value heads for " + std::to_string(heads) +
                             " heads) runs on the flash kernels; the materialized kernel takes kv_heads = heads");
        return channels;
    }

    int C_, NH_, KV_;
    AttentionKind attention_;
    Position position_;
    Linear<Act, D> qkv_, proj_;
    int B_ = 0, T_ = 0;
    Act* qkv_out_ = nullptr;  // (B, T, C + 2 KV hs) after Position
    Act* att_ = nullptr;      // (B, NH, T, T) materialised attention only
    Stat* lse_ = nullptr;     // (B, NH, T) flash attention only
    Act* heads_ = nullptr;    // (B, T, C)
};

}  // namespace snug
