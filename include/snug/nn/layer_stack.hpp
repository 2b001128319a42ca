// LayerStack<L>: L layers applied in sequence, each with its own recompute
// mode (keep everything, selective, or full checkpointing), chosen at run time
// by a CheckpointPolicy. The stack keeps every layer's input (the previous
// layer's output) in the activation arena; that is all a fully checkpointed
// layer keeps.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "snug/core/tensor.hpp"
#include "snug/checkpoint/recompute.hpp"
#include "snug/nn/checkpointed.hpp"
#include "snug/nn/context.hpp"
#include "snug/nn/layer.hpp"

namespace snug {

// A layer that can keep only part of its activations: set_selective(true)
// makes its forward keep the expensive part and its backward recompute the rest.
template <class L>
concept SelectiveLayer = Layer<L> && requires(L& layer, bool on) { layer.set_selective(on); };

// Called by a backward after block (layer) l's backward: that block's
// parameter gradients are final for this pass (TrainStep starts summing them
// over the ranks while the backward goes on).
using AfterBlock = std::function<void(int l)>;

template <Layer L>
class LayerStack {
public:
    using value_type = typename L::value_type;
    using device_type = typename L::device_type;
    using T = value_type;
    using D = device_type;

    // Layer i is called `name_prefix` + i in errors ("layers.3": the prefix of
    // its tensors' names, where it has them).
    explicit LayerStack(std::vector<L> layers, std::string name_prefix = "layer ")
        : layers_(non_empty(std::move(layers))),
          modes_(layers_.size(), Recompute::none),
          states_(layers_.size()),
          marks_(layers_.size()),
          name_prefix_(std::move(name_prefix)) {}

    // How errors name layer i.
    std::string name(std::size_t i) const { return name_prefix_ + std::to_string(i); }

    std::size_t size() const { return layers_.size(); }
    L& operator[](std::size_t i) { return layers_[i]; }
    std::span<const Recompute> modes() const { return modes_; }

    // One mode per layer. Recompute::selective needs a SelectiveLayer.
    void set_modes(std::span<const Recompute> modes) {
        if (modes.size() != layers_.size())
            throw Error("LayerStack: " + std::to_string(modes.size()) + " recompute modes for " +
                        std::to_string(layers_.size()) + " layers");
        for (std::size_t i = 0; i < modes.size(); ++i) {
            if constexpr (SelectiveLayer<L>) {
                // A fully checkpointed layer replays its plain forward: nothing to recompute twice.
                layers_[i].set_selective(modes[i] == Recompute::selective);
            } else {
                if (modes[i] == Recompute::selective)
                    throw Error("LayerStack: layer " + std::to_string(i) +
                                " cannot recompute selectively (its type has no set_selective)");
            }
            modes_[i] = modes[i];
        }
    }

    // Runs every layer on x and returns the last layer's output. Each layer's
    // output is pushed onto ctx.activations just before that layer runs, and
    // stays there until backward (it is the next layer's input).
    TensorView<T, D> forward(Context<D>& ctx, TensorView<const T, D> x) {
        shape_ = x.shape();
        const auto count = static_cast<std::size_t>(shape_.numel());
        inputs_.assign(1, x.data());
        outputs_.clear();
        for (std::size_t i = 0; i < layers_.size(); ++i) {
            outputs_.push_back(ctx.activations.template push<T>(count, "layer output"));
            marks_[i] = ctx.activations.mark();
            const TensorView<const T, D> in(inputs_.back(), shape_);
            const TensorView<T, D> out(outputs_.back(), shape_);
            if (modes_[i] == Recompute::full)
                checkpointed_forward(layers_[i], states_[i], ctx, in, out);
            else
                layers_[i].forward(ctx, in, out);
            inputs_.push_back(outputs_.back());
        }
        return {outputs_.back(), shape_};
    }

    // Backward through every layer. On entry `grad` holds the gradient of the
    // last output; `other` is a second buffer of the same shape. Gradients
    // alternate between the two; the returned one holds the gradient of the
    // stack's input. Pops every output that forward pushed. `after`, if set,
    // is called with each layer's index once its backward is done. A layer
    // whose backward leaves its forward's activations live (or pops others')
    // is refused at once, by its name().
    T* backward(Context<D>& ctx, T* grad, T* other, const AfterBlock& after = {}) {
        for (std::size_t j = layers_.size(); j-- > 0;) {
            const TensorView<const T, D> in(inputs_[j], shape_);
            const TensorView<const T, D> dout(grad, shape_);
            const TensorView<T, D> din(other, shape_);
            if (modes_[j] == Recompute::full)
                checkpointed_backward(layers_[j], states_[j], ctx, in, dout, din, name(j));
            else
                layers_[j].backward(ctx, in, dout, din);
            ctx.activations.expect_released_to(marks_[j], name(j));
            ctx.activations.pop(outputs_[j]);  // pushed just before layer j's own activations
            std::swap(grad, other);
            if (after) after(static_cast<int>(j));
        }
        return grad;
    }

private:
    // Checked before the other members are built (GCC 12 warns falsely about
    // freeing them on a throw from the constructor's body).
    static std::vector<L> non_empty(std::vector<L> layers) {
        if (layers.empty()) throw Error("LayerStack: needs at least one layer");
        return layers;
    }

    std::vector<L> layers_;
    std::vector<Recompute> modes_;
    std::vector<CheckpointState> states_;
    std::vector<typename ActivationArena<D>::Mark> marks_;  // marks_[i]: the arena just before layer i's forward
    std::string name_prefix_;
    std::vector<const T*> inputs_;  // inputs_[i]: layer i's input (the stack's input, then outputs)
    std::vector<T*> outputs_;       // outputs_[i]: layer i's output, in the activation arena
    Shape shape_;
};

}  // namespace snug
