// The Layer concept: what a type must offer so that snug's policies can wrap
// it (checkpointing, precision). A layer maps an input tensor to an output
// tensor; forward keeps in ctx.activations what backward needs, and backward
// gives it back in reverse order.
#pragma once

#include <concepts>

#include "snug/core/tensor.hpp"
#include "snug/nn/context.hpp"

namespace snug {

// Each requirement is its own concept so that a type missing one member fails
// to compile with that member's name in the message.
template <class L>
concept LayerTypes = requires {
    typename L::value_type;   // element type of activations (float, bfloat16, half)
    typename L::device_type;  // snug::Host or snug::Cuda
};

template <class L>
concept LayerOutputShape = requires(const L& layer, const Shape& in) {
    { layer.output_shape(in) } -> std::same_as<Shape>;
};

// forward(ctx, in, out): reads `in`, writes `out` (shape output_shape(in)),
// pushes what backward needs onto ctx.activations.
template <class L>
concept LayerForward = LayerTypes<L> && requires(L& layer, Context<typename L::device_type>& ctx,
                                                 TensorView<const typename L::value_type, typename L::device_type> in,
                                                 TensorView<typename L::value_type, typename L::device_type> out) {
    layer.forward(ctx, in, out);
};

// backward(ctx, in, dout, din): given the same `in` as forward and the
// gradient of the output, writes the gradient of the input (overwriting din),
// adds parameter gradients into the layer's fp32 gradient buffers, and pops
// everything its forward pushed.
template <class L>
concept LayerBackward = LayerTypes<L> && requires(L& layer, Context<typename L::device_type>& ctx,
                                                  TensorView<const typename L::value_type, typename L::device_type> in,
                                                  TensorView<const typename L::value_type, typename L::device_type> dout,
                                                  TensorView<typename L::value_type, typename L::device_type> din) {
    layer.backward(ctx, in, dout, din);
};

template <class L>
concept Layer = LayerTypes<L> && LayerOutputShape<L> && LayerForward<L> && LayerBackward<L>;

}  // namespace snug
