// The kernels of snug::Meter (snug/meter/device.hpp): every op the host and
// CUDA backends have, computing nothing. Layers call them unqualified with
// the device tag first, so argument-dependent lookup finds these for a Meter
// tag exactly as it finds the host loops or CUDA launchers for theirs. The
// ops with a shared contract (snug/ops/) check their arguments as the other
// backends do, so a plan refuses the shapes training would refuse. A user's
// own kernels add a Meter overload the same way (examples/custom_layer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "snug/meter/device.hpp"
#include "snug/ops/adamw.hpp"
#include "snug/ops/moment_quantization.hpp"
#include "snug/ops/attention.hpp"
#include "snug/ops/flash_attention.hpp"
#include "snug/ops/fused_attention.hpp"
#include "snug/ops/cross_entropy.hpp"
#include "snug/ops/encoder.hpp"
#include "snug/ops/layernorm.hpp"
#include "snug/ops/linear.hpp"
#include "snug/ops/rmsnorm.hpp"
#include "snug/ops/rope.hpp"
#include "snug/ops/swiglu.hpp"
#include "snug/ops/sizes.hpp"

namespace snug::meter {

template <class T, class S>
void layernorm_forward(const Device&, T* /*out (N, C)*/, S* /*mean (N)*/, S* /*rstd (N)*/, const T* /*inp (N, C)*/,
                       const T* /*weight (C)*/, const T* /*bias (C)*/, std::int64_t N, int C) {
    ops::check_layernorm("layernorm_forward", N, C);
}

template <class T, class S>
void residual_layernorm_forward(const Device&, T* /*out (N, C)*/, S* /*mean (N)*/, S* /*rstd (N)*/,
                                T* /*res (N, C)*/, const T* /*x (N, C)*/, const T* /*weight (C)*/,
                                const T* /*bias (C)*/, std::int64_t N, int C) {
    ops::check_layernorm("residual_layernorm_forward", N, C);
}

template <class T, class S>
void layernorm_backward(const Device&, T* /*dinp (N, C)*/, float* /*dweight (C)*/, float* /*dbias (C)*/,
                        const T* /*dout (N, C)*/, const T* /*inp (N, C)*/, const T* /*weight (C)*/,
                        const S* /*mean (N)*/, const S* /*rstd (N)*/, std::int64_t N, int C) {
    ops::check_layernorm("layernorm_backward", N, C);
}

template <class T, class S>
void rmsnorm_forward(const Device&, T* /*out (N, C)*/, S* /*rstd (N)*/, const T* /*inp (N, C)*/,
                     const T* /*weight (C)*/, std::int64_t N, int C, double eps = ops::rmsnorm_eps) {
    ops::check_rmsnorm("rmsnorm_forward", N, C, eps);
}

template <class T, class S>
void rmsnorm_backward(const Device&, T* /*dinp (N, C)*/, float* /*dweight (C)*/, const T* /*dout (N, C)*/,
                      const T* /*inp (N, C)*/, const T* /*weight (C)*/, const S* /*rstd (N)*/, std::int64_t N,
                      int C) {
    ops::check_rmsnorm("rmsnorm_backward", N, C);
}

template <class T>
void swiglu_forward(const Device&, T* /*out (N, H)*/, const T* /*inp (N, 2H)*/, std::int64_t N, int H) {
    ops::check_swiglu("swiglu_forward", N, H);
}

template <class T>
void swiglu_backward(const Device&, T* /*dinp (N, 2H)*/, const T* /*inp (N, 2H)*/, const T* /*dout (N, H)*/,
                     std::int64_t N, int H) {
    ops::check_swiglu("swiglu_backward", N, H);
}

template <class T>
void rope_forward(const Device&, T* /*out (B, T, NH, hs)*/, const T* /*inp (B, T, NH, hs)*/, int B, int T_, int NH,
                  int hs, double theta = ops::rope_theta, std::int64_t pos_offset = 0, std::int64_t row_stride = 0) {
    ops::check_rope("rope_forward", B, T_, NH, hs, theta, pos_offset, row_stride);
}

template <class T>
void rope_backward(const Device&, T* /*dinp (B, T, NH, hs)*/, const T* /*dout (B, T, NH, hs)*/, int B, int T_,
                   int NH, int hs, double theta = ops::rope_theta, std::int64_t pos_offset = 0,
                   std::int64_t row_stride = 0) {
    ops::check_rope("rope_backward", B, T_, NH, hs, theta, pos_offset, row_stride);
}

template <class T>
void attention_forward(const Device&, T* /*out (B, T, C)*/, T* /*att (B, NH, T, T)*/, const T* /*qkv (B, T, 3C)*/,
                       int B, int T_, int C, int NH) {
    ops::check_attention("attention_forward", B, T_, C, NH);
}

template <class T>
void attention_backward(const Device&, T* /*dqkv (B, T, 3C)*/, T* /*scratch (B, NH, T, T)*/,
                        const T* /*dout (B, T, C)*/, const T* /*qkv (B, T, 3C)*/, const T* /*att (B, NH, T, T)*/,
                        int B, int T_, int C, int NH) {
    ops::check_attention("attention_backward", B, T_, C, NH);
}

template <class T>
void flash_attention_forward(const Device&, T* /*out (B, T, C)*/, ops::flash_stat_t<T>* /*lse (B, NH, T)*/,
                             const T* /*qkv (B, T, C + 2 KV hs)*/, int B, int T_, int C, int NH, int KV) {
    ops::check_flash_attention("flash_attention_forward", B, T_, C, NH, KV);
}
template <class T>
void flash_attention_forward(const Device& dev, T* out, ops::flash_stat_t<T>* lse, const T* qkv, int B, int T_, int C,
                             int NH) {
    flash_attention_forward(dev, out, lse, qkv, B, T_, C, NH, NH);
}

template <class T>
void flash_attention_backward(const Device&, T* /*dqkv (B, T, C + 2 KV hs)*/,
                              ops::flash_stat_t<T>* /*scratch (B, NH, T)*/, const T* /*dout (B, T, C)*/,
                              const T* /*qkv (B, T, C + 2 KV hs)*/, const T* /*out (B, T, C)*/,
                              const ops::flash_stat_t<T>* /*lse (B, NH, T)*/, int B, int T_, int C, int NH, int KV) {
    ops::check_flash_attention("flash_attention_backward", B, T_, C, NH, KV);
}
template <class T>
void flash_attention_backward(const Device& dev, T* dqkv, ops::flash_stat_t<T>* scratch, const T* dout, const T* qkv,
                              const T* out, const ops::flash_stat_t<T>* lse, int B, int T_, int C, int NH) {
    flash_attention_backward(dev, dqkv, scratch, dout, qkv, out, lse, B, T_, C, NH, NH);
}

// Fused attention (ops/fused_attention.hpp): the planned-for device's engine
// answers which calls it takes and their workspace; the calls do nothing.
template <FusedAttentionInput T>
std::string fused_attention_refusal(const Device& dev, int B, int T_, int C, int NH) {
    if (dev.fused == nullptr) return "the device planned for has no fused attention engine";
    return dev.fused->refusal({dtype_of<T>, B, T_, C, NH});
}

inline std::string fused_attention_engine(const Device& dev) {
    return dev.fused != nullptr ? dev.fused->describe() : "none";
}

template <FusedAttentionInput T>
std::size_t fused_attention_workspace(const Device& dev, AttentionPass pass, int B, int T_, int C, int NH) {
    if (dev.fused == nullptr) throw Error("fused_attention_workspace: the device planned for has no fused engine");
    return dev.fused->workspace_bytes({dtype_of<T>, B, T_, C, NH}, pass);
}

template <FusedAttentionInput T>
void fused_attention_forward(const Device&, std::byte* /*workspace*/, T* /*out (B, T, C)*/, float* /*lse (B, NH, T)*/,
                             const T* /*qkv (B, T, 3C)*/, int B, int T_, int C, int NH) {
    ops::check_flash_attention("fused_attention_forward", B, T_, C, NH);
}

template <FusedAttentionInput T>
void fused_attention_backward(const Device&, std::byte* /*workspace*/, T* /*dqkv (B, T, 3C)*/,
                              const T* /*dout (B, T, C)*/, const T* /*qkv (B, T, 3C)*/, const T* /*out (B, T, C)*/,
                              const float* /*lse (B, NH, T)*/, int B, int T_, int C, int NH) {
    ops::check_flash_attention("fused_attention_backward", B, T_, C, NH);
}

template <class T>
void encoder_forward(const Device&, T* /*out (B, T, C)*/, const std::int32_t* /*tokens (B, T)*/,
                     const T* /*wte (Vp, C)*/, const T* /*wpe (maxT, C)*/, int B, int T_, int C) {
    ops::check_encoder("encoder_forward", B, T_, C);
}

template <class T>
void encoder_backward(const Device&, float* /*dwte (Vp, C)*/, float* /*dwpe (maxT, C)*/, const T* /*dout (B, T, C)*/,
                      const std::int32_t* /*tokens (B, T)*/, int B, int T_, int C) {
    ops::check_encoder("encoder_backward", B, T_, C);
}

template <class T>
void softmax_cross_entropy(const Device&, float* /*losses (N)*/, T* /*logits (N, Vp)*/,
                           const std::int32_t* /*targets (N)*/, std::int64_t N, int V, int Vp, float /*dloss*/) {
    ops::check_cross_entropy("softmax_cross_entropy", N, V, Vp);
}

template <class T>
void linear_forward(const Device&, T* out /*(N, OC)*/, const T* inp /*(N, C)*/, const T* weight /*(OC, C)*/,
                    const T* /*bias (OC) or nullptr*/, std::int64_t N, int C, int OC) {
    ops::check_linear_forward("linear_forward", out, inp, weight, N, C, OC);
}

template <class T>
void linear_backward(const Device&, T* dinp /*(N, C) or nullptr*/, float* dweight /*(OC, C)*/,
                     float* /*dbias (OC) or nullptr*/, const T* dout /*(N, OC)*/, const T* inp /*(N, C)*/,
                     const T* weight /*(OC, C)*/, std::int64_t N, int C, int OC) {
    ops::check_linear_backward("linear_backward", dinp, dweight, dout, inp, weight, N, C, OC);
}

template <class T, class P, class M>
void adamw_update(const Device&, P* /*master or bf16 weights (n)*/, T* /*working (n) or nullptr*/,
                  const float* /*grad (n)*/, M* /*m (n)*/, M* /*v (n)*/, std::int64_t n, float /*lr*/, float /*beta1*/,
                  float /*beta2*/, float /*eps*/, float /*weight_decay*/, int step, float /*grad_scale*/,
                  ops::AdamWRounding = {}) {
    ops::check_adamw(n, step);
}

// Without a working copy (fp32 weights, or bf16 weights with no master).
template <class P, class M>
void adamw_update(const Device& dev, P* master, std::nullptr_t, const float* grad, M* m, M* v, std::int64_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int step, float grad_scale,
                  ops::AdamWRounding rounding = {}) {
    adamw_update(dev, master, static_cast<float*>(nullptr), grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step,
                 grad_scale, rounding);
}

template <class T, class P>
void adamw_update_8bit(const Device&, P* /*master or bf16 weights (n)*/, T* /*working (n) or nullptr*/,
                       const float* /*grad (n)*/, ops::BlockwiseMoments, std::int64_t n, float /*lr*/,
                       float /*beta1*/, float /*beta2*/, float /*eps*/, float /*weight_decay*/, int step,
                       float /*grad_scale*/, ops::AdamWRounding = {}) {
    ops::check_adamw_8bit(n, step);
}

template <class P>
void adamw_update_8bit(const Device& dev, P* master, std::nullptr_t, const float* grad, ops::BlockwiseMoments moments,
                       std::int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                       float grad_scale, ops::AdamWRounding rounding = {}) {
    adamw_update_8bit(dev, master, static_cast<float*>(nullptr), grad, moments, n, lr, beta1, beta2, eps, weight_decay,
                      step, grad_scale, rounding);
}

// The element-wise ops: n elements, nothing else to check.
template <class... Args> void gelu_forward(const Device&, Args&&...) {}
template <class... Args> void gelu_backward(const Device&, Args&&...) {}
template <class... Args> void residual_forward(const Device&, Args&&...) {}
template <class... Args> void add_inplace(const Device&, Args&&...) {}
template <class... Args> void scale_inplace(const Device&, Args&&...) {}
template <class... Args> void cast(const Device&, Args&&...) {}
template <class... Args> void unscale_and_check(const Device&, Args&&...) {}
template <class... Args> void sum_squares(const Device&, Args&&...) {}
template <class... Args> void accumulate_sum(const Device&, Args&&...) {}
// Transfers: a download leaves the host side as it was.
template <class... Args> void upload(const Device&, Args&&...) {}
template <class... Args> void download(const Device&, Args&&...) {}
template <class... Args> void copy(const Device&, Args&&...) {}
template <class... Args> void fill_zero(const Device&, Args&&...) {}

}  // namespace snug::meter
