// GatedResidual<Act, D>: a block written outside snug, the way a user writes
// one so that snug's policies can wrap it and snug::CausalLM can make a model
// of it. Copy this file as the template for
// your own layer; the pieces, top to bottom:
//
//   1. The math, once:  y = x + (x ⊙ s) ⊙ w   with   s = sigmoid(x ⊙ g),
//      g and w per-channel parameters (C). A helper both backends share.
//   2. Its kernels, one overload per device tag: a plain loop for snug::Host,
//      nothing for snug::Meter (the device the planner measures memory on),
//      a __global__ kernel for snug::Cuda, started by snug::cuda::launch
//      (compiled by nvcc, or by the host compiler for the emulated CUDA
//      backend, which runs it on the CPU with its faults checked). The layer
//      calls them unqualified with ctx.device first, so overloading on the tag
//      picks the backend, as snug's own kernels are picked.
//   3. The block class, which models snug::Layer: its forward saves s in
//      ctx.activations, its backward pops it. That contract is what lets
//      snug::LayerStack checkpoint it (Recompute::full replays the forward;
//      the arena's accounting lets the budget policy plan memory). It also
//      offers set_selective(): in that mode it saves nothing and recomputes s
//      from the input in backward — which makes it a snug::SelectiveLayer, so
//      checkpoint::Selective and Budget can use it. It declares its tensors
//      into the model's registry and is bound to the model's buffers.
//   4. The family: what snug::CausalLM needs to build the whole model around
//      the blocks (static_assert below: snug::CausalLMFamily).
//
// Numerics: activations are Act (float, snug::bfloat16, snug::half), all math
// is fp32, parameter gradients accumulate into fp32 buffers. s is rounded to
// Act before it is used, whether it was saved or recomputed, so every
// recompute mode gives the same bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "snug/core/config.hpp"
#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/core/tensor.hpp"
#include "snug/meter/device.hpp"
#include "snug/nn/context.hpp"
#include "snug/nn/family.hpp"
#include "snug/nn/layer.hpp"
#include "snug/nn/layer_stack.hpp"
#include "snug/nn/model_identity.hpp"
#include "snug/nn/parameters.hpp"
#include "snug/nn/rmsnorm.hpp"

#if defined(SNUG_CUDA_BACKEND)
#include "snug/cuda/device.hpp"
#include "snug/cuda/launch.hpp"
#include "snug/cuda/shared_memory.hpp"
#endif

namespace tiny {

// ---- 1. The math, shared by both backends ----------------------------------

// s = sigmoid(x g), rounded to T (the value forward saves, or backward
// recomputes: the same bits either way).
template <class T>
SNUG_HD float gate(float x, float g) {
    return static_cast<float>(T(1.0f / (1.0f + std::exp(-x * g))));
}

// One element of the backward: dx, and the contributions to dg and dw.
struct GateGrads {
    float dx, dg, dw;
};
SNUG_HD GateGrads gate_grads(float dy, float x, float s, float g, float w) {
    const float ds = s * (1.0f - s);  // sigmoid'
    return {dy * (1.0f + w * (s + x * g * ds)), dy * w * x * x * ds, dy * x * s};
}

// ---- 2. The kernels, one overload per device tag ----------------------------

// y = x + x s w, s = sigmoid(x g); s is stored in `saved` unless it is null.
template <class T>
void gated_residual_forward(const snug::Host&, T* y,  // (N, C)
                            T* saved,                 // (N, C) or nullptr
                            const T* x,               // (N, C)
                            const T* g,               // (C)
                            const T* w,               // (C)
                            std::int64_t N, int C) {
    for (std::int64_t n = 0; n < N; ++n) {
        for (int c = 0; c < C; ++c) {
            const std::int64_t i = n * C + c;
            const float xv = static_cast<float>(x[i]);
            const float s = gate<T>(xv, static_cast<float>(g[c]));
            if (saved != nullptr) saved[i] = T(s);
            y[i] = T(xv + xv * s * static_cast<float>(w[c]));
        }
    }
}

// dx = dy ∂y/∂x (overwritten); dg, dw += their gradients (fp32). `saved` is
// forward's s, or nullptr: recompute it from x.
template <class T>
void gated_residual_backward(const snug::Host&, T* dx,  // (N, C)
                             float* dg,                 // (C) +=
                             float* dw,                 // (C) +=
                             const T* dy,               // (N, C)
                             const T* x,                // (N, C)
                             const T* saved,            // (N, C) or nullptr
                             const T* g,                // (C)
                             const T* w,                // (C)
                             std::int64_t N, int C) {
    for (std::int64_t n = 0; n < N; ++n) {
        for (int c = 0; c < C; ++c) {
            const std::int64_t i = n * C + c;
            const float xv = static_cast<float>(x[i]), gc = static_cast<float>(g[c]);
            const float s = saved != nullptr ? static_cast<float>(saved[i]) : gate<T>(xv, gc);
            const GateGrads d = gate_grads(static_cast<float>(dy[i]), xv, s, gc, static_cast<float>(w[c]));
            dx[i] = T(d.dx);
            dg[c] += d.dg;
            dw[c] += d.dw;
        }
    }
}

#if defined(SNUG_CUDA_BACKEND)

// Grid-stride over the N C elements.
template <class T>
__global__ void gated_residual_forward_kernel(T* y, T* saved, const T* x, const T* g, const T* w, std::int64_t n,
                                              int C) {
    const std::int64_t stride = std::int64_t{gridDim.x} * blockDim.x;
    for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n; i += stride) {
        const int c = static_cast<int>(i % C);
        const float xv = static_cast<float>(x[i]);
        const float s = gate<T>(xv, static_cast<float>(g[c]));
        if (saved != nullptr) saved[i] = T(s);
        y[i] = T(xv + xv * s * static_cast<float>(w[c]));
    }
}

// A block is 32 channels (threadIdx.x) by 8 row lanes (threadIdx.y): each
// thread walks every 8th row of its channel, writing dx and summing its dg, dw
// in registers; the 8 lanes are then added in a fixed order, so the result is
// deterministic (no atomics) and the same on every run.
inline constexpr int gate_block_channels = 32;
inline constexpr int gate_block_rows = 8;

template <class T>
__global__ void gated_residual_backward_kernel(T* dx, float* dg, float* dw, const T* dy, const T* x, const T* saved,
                                               const T* g, const T* w, std::int64_t N, int C) {
    const int c = blockIdx.x * gate_block_channels + threadIdx.x;
    float sum_g = 0.0f, sum_w = 0.0f;
    if (c < C) {
        const float gc = static_cast<float>(g[c]), wc = static_cast<float>(w[c]);
        for (std::int64_t n = threadIdx.y; n < N; n += gate_block_rows) {
            const std::int64_t i = n * C + c;
            const float xv = static_cast<float>(x[i]);
            const float s = saved != nullptr ? static_cast<float>(saved[i]) : gate<T>(xv, gc);
            const GateGrads d = gate_grads(static_cast<float>(dy[i]), xv, s, gc, wc);
            dx[i] = T(d.dx);
            sum_g += d.dg;
            sum_w += d.dw;
        }
    }
    // Shared memory through snug::cuda::block_shared, so that the emulated
    // backend gives each block fresh, poisoned memory and checks it for races.
    struct Parts {
        float g[gate_block_rows][gate_block_channels];
        float w[gate_block_rows][gate_block_channels];
    };
    Parts& parts = snug::cuda::block_shared<Parts>();
    auto& part_g = parts.g;
    auto& part_w = parts.w;
    part_g[threadIdx.y][threadIdx.x] = sum_g;
    part_w[threadIdx.y][threadIdx.x] = sum_w;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int r = 1; r < gate_block_rows; ++r) {
            sum_g += part_g[r][threadIdx.x];
            sum_w += part_w[r][threadIdx.x];
        }
        dg[c] += sum_g;
        dw[c] += sum_w;
    }
}

// The CUDA overloads: the same arguments, launched on the tag's stream.
template <class T>
void gated_residual_forward(const snug::Cuda& dev, T* y,  // (N, C)
                            T* saved,                     // (N, C) or nullptr
                            const T* x,                   // (N, C)
                            const T* g,                   // (C)
                            const T* w,                   // (C)
                            std::int64_t N, int C) {
    const std::int64_t n = N * C;
    if (n == 0) return;
    const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((n + 255) / 256, 4096));
    snug::cuda::launch<gated_residual_forward_kernel<T>>(blocks, 256, 0, dev.stream, y, saved, x, g, w, n, C);
}

template <class T>
void gated_residual_backward(const snug::Cuda& dev, T* dx,  // (N, C)
                             float* dg,                     // (C) +=
                             float* dw,                     // (C) +=
                             const T* dy,                   // (N, C)
                             const T* x,                    // (N, C)
                             const T* saved,                // (N, C) or nullptr
                             const T* g,                    // (C)
                             const T* w,                    // (C)
                             std::int64_t N, int C) {
    if (N == 0 || C == 0) return;
    const dim3 block(gate_block_channels, gate_block_rows);
    const auto blocks = static_cast<unsigned>((C + gate_block_channels - 1) / gate_block_channels);
    snug::cuda::launch<gated_residual_backward_kernel<T>>(blocks, block, 0, dev.stream, dx, dg, dw, dy, x, saved, g, w,
                                                          N, C);
}

#endif  // SNUG_CUDA_BACKEND

// The snug::Meter overloads: nothing to compute. snug runs the model on the
// metering device to measure its memory (snug/meter/device.hpp); a kernel
// there only has to exist.
template <class... Args>
void gated_residual_forward(const snug::Meter&, Args&&...) {}
template <class... Args>
void gated_residual_backward(const snug::Meter&, Args&&...) {}

// ---- 3. The block ------------------------------------------------------------

// What one block needs to be built: its width.
struct GatedShape {
    int channels = 0;  // C
};

//   Act: activation type (float, snug::bfloat16, snug::half; double for
//        snug::check_gradients on the host)
//   D:   device tag (snug::Host, snug::Cuda, snug::Meter)
// Its two tensors, `<prefix>gate.weight` g (C, ones) and `<prefix>scale.weight`
// w (C, small), are declared into the model's registry; bind() points the
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

// snug::CausalLM<TinyFamily, Act, D> is the model: token and learned position
// embeddings, the GatedResidual blocks in a LayerStack (so every checkpoint
// policy applies), a final RMSNorm, the head tied to the token embedding, the
// loss. What CausalLM asks of a family is snug::CausalLMFamily
// (snug/nn/family.hpp): miss a member and the compiler names it.
struct TinyFamily {
    using BlockShape = GatedShape;
    template <class Act, snug::DeviceTag D>
    using Block = GatedResidual<Act, D>;
    template <class Act, snug::DeviceTag D>
    using FinalNorm = snug::RMSNorm<Act, D>;
    static int channels(const BlockShape& s) { return s.channels; }
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
