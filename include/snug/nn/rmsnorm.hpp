// RMSNorm<Act, D>: out = x / rms(x) * weight per row (Llama's norm), a module
// (nn/module.hpp) with one tensor, `name.weight` (C), ones, not decayed.
// forward keeps the per-row 1/rms (fp32) on the arena it is given.
#pragma once

#include <cstdint>
#include <string>

#include "snug/core/arena.hpp"
#include "snug/core/device.hpp"
#include "snug/nn/module.hpp"
#include "snug/nn/parameters.hpp"
#include "snug/ops/kernels.hpp"

namespace snug {

template <class Act, DeviceTag D>
class RMSNorm {
public:
    RMSNorm(ParameterRegistry& r, const std::string& name, int channels, double eps = ops::rmsnorm_eps)
        : C_(channels), eps_(eps) {
        weight_ = r.add(name + ".weight", Shape{channels}, Init::ones(), Decay::no);
    }

    void bind(ParameterBinding<Act> b) {
        w_ = b.params + weight_;
        gw_ = b.grads + weight_;
    }

    void forward(ActivationArena<D>& keep, const D& dev, Act* out /*(N, C)*/, const Act* in /*(N, C)*/,
                 std::int64_t N) {
        rstd_ = keep.template push<float>(N, "rmsnorm rstd");
        rmsnorm_forward(dev, out, rstd_, in, w_, N, C_, eps_);
    }

    // din += the gradient through the norm (a residual's gradient is usually
    // there already); adds into the weight's gradient.
    void backward(const D& dev, Act* din /*(N, C) +=*/, const Act* dout /*(N, C)*/, const Act* in /*(N, C)*/,
                  std::int64_t N) const {
        rmsnorm_backward(dev, din, gw_, dout, in, w_, rstd_, N, C_);
    }

private:
    int C_;
    double eps_;
    std::int64_t weight_ = -1;
    const Act* w_ = nullptr;
    float* gw_ = nullptr;
    float* rstd_ = nullptr;  // (N) of the last forward
};

}  // namespace snug
