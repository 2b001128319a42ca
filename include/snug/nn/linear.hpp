// Linear<Act, D>: y = x W^T (+ b), a module that declares its weight (out,
// in) and optional bias (out) into a ParameterRegistry and calls the backend's
// GEMM. A module (see nn/module.hpp) is a piece of a block: the block owns the
// activations it passes in and out; the module keeps pointers into the
// model's parameter and gradient buffers once bound.
#pragma once

#include <cstdint>
#include <string>

#include "snug/core/device.hpp"
#include "snug/nn/module.hpp"
#include "snug/nn/parameters.hpp"
#include "snug/ops/kernels.hpp"

namespace snug {

enum class Bias : bool { no = false, yes = true };

template <class Act, DeviceTag D>
class Linear {
public:
    // Declares `name.weight` (out, in), decayed, drawn from `init`, and with
    // Bias::yes `name.bias` (out), zeros, not decayed.
    Linear(ParameterRegistry& r, const std::string& name, int in, int out, Bias bias = Bias::no,
           Init init = Init::normal(0.02f))
        : in_(in), out_(out) {
        if (in <= 0 || out <= 0)
            throw ShapeError("Linear '" + name + "': in (" + std::to_string(in) + ") and out (" + std::to_string(out) +
                             ") features must be positive");
        weight_ = r.add(name + ".weight", Shape{out, in}, init, Decay::yes);
        if (bias == Bias::yes) bias_ = r.add(name + ".bias", Shape{out}, Init::zeros(), Decay::no);
    }

    int in_features() const { return in_; }
    int out_features() const { return out_; }

    void bind(ParameterBinding<Act> b) {
        w_ = b.params + weight_;
        gw_ = b.grads + weight_;
        b_ = bias_ >= 0 ? b.params + bias_ : nullptr;
        gb_ = bias_ >= 0 ? b.grads + bias_ : nullptr;
    }

    void forward(const D& dev, Act* out /*(N, out)*/, const Act* in /*(N, in)*/, std::int64_t N) const {
        linear_forward(dev, out, in, w_, b_, N, in_, out_);
    }

    // din (overwritten; nullptr: not wanted) from dout; adds into the fp32
    // weight (and bias) gradients.
    void backward(const D& dev, Act* din /*(N, in)*/, const Act* dout /*(N, out)*/, const Act* in /*(N, in)*/,
                  std::int64_t N) const {
        linear_backward(dev, din, gw_, gb_, dout, in, w_, N, in_, out_);
    }

private:
    int in_, out_;
    std::int64_t weight_ = -1, bias_ = -1;  // offsets in the registry's buffers
    const Act* w_ = nullptr;
    const Act* b_ = nullptr;
    float* gw_ = nullptr;
    float* gb_ = nullptr;
};

}  // namespace snug
