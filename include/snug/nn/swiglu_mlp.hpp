// SwiGLUMLP<Act, D>: Llama's MLP, a module (nn/module.hpp):
//   x (N, C) ─► gate_up (C -> 2H, one fused projection, gate rows first)
//            ─► silu(gate) * up (N, H) ─► down (H -> C) ─► out (N, C)
// Tensors `name.gate_up_proj.weight` (2H, C) and `name.down_proj.weight`
// (C, H), no biases. forward keeps gate_up's output and the product on the
// arena it is given; backward's temporaries go to the scratch arena.
#pragma once

#include <cstdint>
#include <string>

#include "snug/core/arena.hpp"
#include "snug/core/device.hpp"
#include "snug/nn/linear.hpp"
#include "snug/nn/module.hpp"
#include "snug/nn/parameters.hpp"
#include "snug/ops/kernels.hpp"

namespace snug {

template <class Act, DeviceTag D>
class SwiGLUMLP {
public:
    // down_init: the output projection's initialisation (a residual branch's
    // is usually scaled down with depth).
    SwiGLUMLP(ParameterRegistry& r, const std::string& name, int channels, int hidden,
              Init down_init = Init::normal(0.02f))
        : H_(hidden),
          gate_up_(r, name + ".gate_up_proj", channels, 2 * hidden),
          down_(r, name + ".down_proj", hidden, channels, Bias::no, down_init) {}

    int hidden() const { return H_; }

    void bind(ParameterBinding<Act> b) {
        gate_up_.bind(b);
        down_.bind(b);
    }

    void forward(ActivationArena<D>& keep, const D& dev, Act* out /*(N, C)*/, const Act* in /*(N, C)*/,
                 std::int64_t N) {
        gate_up_out_ = keep.template push<Act>(N * 2 * H_, "mlp gate and up");
        gate_up_.forward(dev, gate_up_out_, in, N);
        hidden_ = keep.template push<Act>(N * H_, "mlp swiglu");
        swiglu_forward(dev, hidden_, gate_up_out_, N, H_);
        down_.forward(dev, out, hidden_, N);
    }

    // din (N, C) overwritten.
    void backward(ActivationArena<D>& scratch, const D& dev, Act* din /*(N, C)*/, const Act* dout /*(N, C)*/,
                  const Act* in /*(N, C)*/, std::int64_t N) const {
        const auto mark = scratch.mark();
        Act* dhidden = scratch.template push<Act>(N * H_, "d mlp swiglu");
        down_.backward(dev, dhidden, dout, hidden_, N);
        Act* dgate_up = scratch.template push<Act>(N * 2 * H_, "d mlp gate and up");
        swiglu_backward(dev, dgate_up, gate_up_out_, dhidden, N, H_);
        gate_up_.backward(dev, din, dgate_up, in, N);
        scratch.release_to(mark);
    }

private:
    int H_;
    Linear<Act, D> gate_up_, down_;
    Act* gate_up_out_ = nullptr;  // (N, 2H) of the last forward
    Act* hidden_ = nullptr;       // (N, H)
};

}  // namespace snug
