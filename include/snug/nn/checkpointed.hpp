// Activation checkpointing for any Layer: forward keeps nothing of the
// layer's internals (only the caller keeps the layer's input), backward runs
// the layer's forward again and then its backward. Recomputation replays the
// same random numbers, so the gradients equal those of the plain layer.
#pragma once

#include <cstdint>
#include <string_view>

#include "snug/core/tensor.hpp"
#include "snug/nn/context.hpp"
#include "snug/nn/layer.hpp"

namespace snug {

// What a checkpointed layer remembers between its forward and its backward:
// where in the random stream its forward started.
struct CheckpointState {
    std::uint64_t rng_offset = 0;
};

// Forward of `layer` that frees the layer's saved activations at once.
// `out` belongs to the caller and survives.
template <Layer L>
void checkpointed_forward(L& layer, CheckpointState& state, Context<typename L::device_type>& ctx,
                          TensorView<const typename L::value_type, typename L::device_type> in,
                          TensorView<typename L::value_type, typename L::device_type> out) {
    state.rng_offset = ctx.rng_offset;
    const auto mark = ctx.activations.mark();
    layer.forward(ctx, in, out);
    ctx.activations.release_to(mark);
}

// Backward of a checkpointed layer: replays its forward from `in` with the
// random stream where it was (the recomputed output goes to a temporary
// activation), then runs its backward, which frees what the replay saved
// (a backward that does not is refused, naming `owner`).
template <Layer L>
void checkpointed_backward(L& layer, const CheckpointState& state, Context<typename L::device_type>& ctx,
                           TensorView<const typename L::value_type, typename L::device_type> in,
                           TensorView<const typename L::value_type, typename L::device_type> dout,
                           TensorView<typename L::value_type, typename L::device_type> din,
                           std::string_view owner = "a checkpointed layer") {
    using T = typename L::value_type;
    const std::uint64_t resume_offset = ctx.rng_offset;
    ctx.rng_offset = state.rng_offset;
    const Shape out_shape = layer.output_shape(in.shape());
    T* recomputed = ctx.activations.template push<T>(static_cast<std::size_t>(out_shape.numel()),
                                                     "checkpoint recomputed output");
    const auto mark = ctx.activations.mark();
    layer.forward(ctx, in, TensorView<T, typename L::device_type>(recomputed, out_shape));
    layer.backward(ctx, in, dout, din);
    ctx.activations.expect_released_to(mark, owner);
    ctx.activations.pop(recomputed);
    ctx.rng_offset = resume_offset;
}

// Checkpointed<L>: a Layer that wraps (and owns) a Layer L and checkpoints it.
template <Layer L>
class Checkpointed {
public:
    using value_type = typename L::value_type;
    using device_type = typename L::device_type;

    explicit Checkpointed(L layer) : layer_(std::move(layer)) {}

    Shape output_shape(const Shape& in) const { return layer_.output_shape(in); }

    void forward(Context<device_type>& ctx, TensorView<const value_type, device_type> in,
                 TensorView<value_type, device_type> out) {
        checkpointed_forward(layer_, state_, ctx, in, out);
    }

    void backward(Context<device_type>& ctx, TensorView<const value_type, device_type> in,
                  TensorView<const value_type, device_type> dout, TensorView<value_type, device_type> din) {
        checkpointed_backward(layer_, state_, ctx, in, dout, din);
    }

    L& inner() { return layer_; }
    const L& inner() const { return layer_; }

private:
    L layer_;
    CheckpointState state_;
};

}  // namespace snug
