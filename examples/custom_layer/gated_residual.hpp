// GatedResidual<Act, D>: a block written outside snug, and TinyFamily, which
// makes snug::CausalLM<TinyFamily, Act, D> a whole model of it; copy it as the
// template for your own layer. 1. The math, once for both backends:
// y = x + (x s) w, s = sigmoid(x g), g and w per-channel parameters (C).
// 2. Its kernels, one overload per device tag (snug::Host: a loop; snug::Cuda:
// __global__ kernels, which the emulated backend runs on the CPU, faults
// checked; snug::Meter, where the planner measures memory: nothing); the block
// calls them with ctx.device first, so overloading picks the backend. 3. The
// block, a snug::Layer: forward saves s on ctx.activations, backward pops it
// (so snug::LayerStack can checkpoint it); selective mode keeps nothing and
// recomputes s. 4. The family. The math is fp32; s is rounded to Act whether
// saved or recomputed, so every recompute mode gives the same bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "snug/snug.hpp"
#if defined(SNUG_CUDA_BACKEND)
#include "snug/cuda/launch.hpp"
#endif

namespace tiny {

// ---- 1. The math, for both backends ------------------------------------------
// x, y, saved (s, or null when not kept), dy, dx: (N, C); g, w: (C); dg, dw: (C) fp32.

// s = sigmoid(x g), rounded to T: the same bits saved or recomputed.
template <class T>
SNUG_HD float gate(float x, float g) {
    return static_cast<float>(T(1.0f / (1.0f + std::exp(-x * g))));
}

// Element i = n C + c of the forward.
template <class T>
SNUG_HD void gate_forward_at(std::int64_t i, int C, T* y, T* saved, const T* x, const T* g, const T* w) {
    const int c = static_cast<int>(i % C);
    const float xv = static_cast<float>(x[i]), s = gate<T>(xv, static_cast<float>(g[c]));
    if (saved != nullptr) saved[i] = T(s);
    y[i] = T(xv + xv * s * static_cast<float>(w[c]));
}

// Channel c of the backward: dx of every row (overwritten); dg[c], dw[c] +=
// the channel's gradients, summed over the rows in order (deterministic).
template <class T>
SNUG_HD void gate_backward_channel(int c, std::int64_t N, int C, T* dx, float* dg, float* dw, const T* dy,
                                   const T* x, const T* saved, const T* g, const T* w) {
    const float gc = static_cast<float>(g[c]), wc = static_cast<float>(w[c]);
    float sum_g = 0.0f, sum_w = 0.0f;
    for (std::int64_t i = c; i < N * C; i += C) {
        const float xv = static_cast<float>(x[i]), d = static_cast<float>(dy[i]);
        const float s = saved != nullptr ? static_cast<float>(saved[i]) : gate<T>(xv, gc), ds = s * (1.0f - s);
        dx[i] = T(d * (1.0f + wc * (s + xv * gc * ds)));
        sum_g += d * wc * xv * xv * ds;
        sum_w += d * xv * s;
    }
    dg[c] += sum_g;
    dw[c] += sum_w;
}

// ---- 2. The kernels, one overload per device tag ----------------------------

template <class T>
void gated_residual_forward(const snug::Host&, T* y, T* saved, const T* x, const T* g, const T* w, std::int64_t N,
                            int C) {
    for (std::int64_t i = 0; i < N * C; ++i) gate_forward_at(i, C, y, saved, x, g, w);
}

template <class T>
void gated_residual_backward(const snug::Host&, T* dx, float* dg, float* dw, const T* dy, const T* x,
                             const T* saved, const T* g, const T* w, std::int64_t N, int C) {
    for (int c = 0; c < C; ++c) gate_backward_channel(c, N, C, dx, dg, dw, dy, x, saved, g, w);
}

// The planner's device: nothing to compute, a kernel there only has to exist.
template <class... Args>
void gated_residual_forward(const snug::Meter&, Args&&...) {}
template <class... Args>
void gated_residual_backward(const snug::Meter&, Args&&...) {}

#if defined(SNUG_CUDA_BACKEND)

template <class T>
__global__ void gated_residual_forward_kernel(T* y, T* saved, const T* x, const T* g, const T* w, std::int64_t n,
                                              int C) {
    const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
    for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += stride)
        gate_forward_at(i, C, y, saved, x, g, w);
}

// One thread per channel: simple, and the host's order of sums. (Faster:
// split the rows across a block and add the parts in shared memory,
// snug::cuda::block_shared, as snug's norms do.)
template <class T>
__global__ void gated_residual_backward_kernel(T* dx, float* dg, float* dw, const T* dy, const T* x, const T* saved,
                                               const T* g, const T* w, std::int64_t N, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < C) gate_backward_channel(c, N, C, dx, dg, dw, dy, x, saved, g, w);
}

template <class T>
void gated_residual_forward(const snug::Cuda& dev, T* y, T* saved, const T* x, const T* g, const T* w,
                            std::int64_t N, int C) {
    if (N * C == 0) return;
    const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((N * C + 255) / 256, 4096));
    snug::cuda::launch<gated_residual_forward_kernel<T>>(blocks, 256, 0, dev.stream, y, saved, x, g, w, N * C, C);
}

template <class T>
void gated_residual_backward(const snug::Cuda& dev, T* dx, float* dg, float* dw, const T* dy, const T* x,
                             const T* saved, const T* g, const T* w, std::int64_t N, int C) {
    if (N == 0 || C == 0) return;
    snug::cuda::launch<gated_residual_backward_kernel<T>>(static_cast<unsigned>((C + 63) / 64), 64, 0, dev.stream, dx,
                                                          dg, dw, dy, x, saved, g, w, N, C);
}

#endif  // SNUG_CUDA_BACKEND

// ---- 3. The block ------------------------------------------------------------

struct GatedShape {  // what one block needs: its width
    int channels = 0;   // C
};

// Act: the activation type; D: the device tag. Its tensors g (C, ones) and
// w (C, small) are declared into the model's registry; bind() points the
// block at them once the model has allocated its buffers.
template <class Act, snug::DeviceTag D>
class GatedResidual {
public:
    using value_type = Act;  // what snug::Layer asks for
    using device_type = D;

    GatedResidual(snug::ParameterRegistry& r, const std::string& prefix, const GatedShape& s)
        : C_(s.channels),
          g_at_(r.add(prefix + "gate.weight", snug::Shape{s.channels}, snug::Init::ones(), snug::Decay::no)),
          w_at_(r.add(prefix + "scale.weight", snug::Shape{s.channels}, snug::Init::normal(0.1f), snug::Decay::no)) {}

    void bind(snug::ParameterBinding<Act> b) {
        g_ = b.params + g_at_;
        w_ = b.params + w_at_;
        dg_ = b.grads + g_at_;
        dw_ = b.grads + w_at_;
    }

    snug::Shape output_shape(const snug::Shape& in) const { return in; }

    // Selective mode: keep nothing, recompute s in backward (it is cheap).
    void set_selective(bool on) { selective_ = on; }

    // in, out: (..., C). Pushes s (N, C) unless selective.
    void forward(snug::Context<D>& ctx, snug::TensorView<const Act, D> in, snug::TensorView<Act, D> out) {
        const std::int64_t N = rows(in, out);
        saved_ = selective_ ? nullptr : ctx.activations.template push<Act>(static_cast<std::size_t>(N * C_), "gate");
        gated_residual_forward(ctx.device, out.data(), saved_, in.data(), g_, w_, N, C_);
    }

    // in: forward's input; dout, din: (..., C). Pops what forward pushed.
    void backward(snug::Context<D>& ctx, snug::TensorView<const Act, D> in, snug::TensorView<const Act, D> dout,
                  snug::TensorView<Act, D> din) {
        const std::int64_t N = rows(in, din);
        gated_residual_backward(ctx.device, din.data(), dg_, dw_, dout.data(), in.data(), saved_, g_, w_, N, C_);
        if (saved_ != nullptr) ctx.activations.pop(saved_);
        saved_ = nullptr;
    }

private:
    // N, the number of C-wide rows; the shapes must agree.
    template <class A, class B>
    std::int64_t rows(const A& in, const B& other) const {
        const snug::Shape& s = in.shape();
        if (s.rank() == 0 || s[s.rank() - 1] != C_ || !(other.shape() == s))
            throw snug::ShapeError("GatedResidual: input " + s.str() + " and output " + other.shape().str() +
                                   " must be the same shape (..., C = " + std::to_string(C_) + ")");
        return s.numel() / C_;
    }

    int C_;
    std::int64_t g_at_, w_at_;  // offsets in the model's buffers
    const Act* g_ = nullptr;
    const Act* w_ = nullptr;
    float* dg_ = nullptr;
    float* dw_ = nullptr;
    bool selective_ = false;
    Act* saved_ = nullptr;  // s, between forward and backward
};

// ---- 4. The family: the whole model around the blocks ------------------------

// snug::CausalLM<TinyFamily, Act, D>: embeddings, the blocks in a LayerStack,
// a final RMSNorm, the tied head, the loss. What it asks of a family is
// snug::CausalLMFamily (snug/nn/family.hpp); a missing member is named.
struct TinyFamily {
    using BlockShape = GatedShape;
    template <class Act, snug::DeviceTag D>
    using Block = GatedResidual<Act, D>;
    template <class Act, snug::DeviceTag D>
    using FinalNorm = snug::RMSNorm<Act, D>;
    static int channels(const BlockShape& s) { return s.channels; }
    // The block that --heads and --channels ask for (snug::train_main): its width.
    static BlockShape block_shape(int /*heads*/, int channels) { return {channels}; }
    static constexpr bool learned_positions = true;
    static constexpr bool tied_head = true;
    // For state files: a state resumes only into a model of this family and width.
    static constexpr std::string_view name = "tiny-gated";
    static std::vector<snug::ModelField> fields(const BlockShape& s) {
        return {{"channels", static_cast<double>(s.channels)}};
    }
};

// Fails to compile, naming the missing member, if the block drifts from the contract.
static_assert(snug::CausalLMFamily<TinyFamily, float, snug::Host>);
static_assert(snug::SelectiveLayer<GatedResidual<float, snug::Host>>);

}  // namespace tiny
