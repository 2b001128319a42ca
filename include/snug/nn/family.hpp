// What CausalLM (nn/causal_lm.hpp) needs from a family and its block, as
// concepts: CausalLMFamily<F, Act, D> and CausalLMBlock<B, Shape>. Each
// requirement is its own concept, and check_family<F, Act, D>() asserts them
// one at a time, so a family or block that lacks a member fails to compile
// with a sentence naming that member (CausalLM calls it first thing), not with
// an error from deep inside the model.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>

#include "snug/core/arena.hpp"
#include "snug/core/device.hpp"
#include "snug/nn/layer.hpp"
#include "snug/nn/module.hpp"
#include "snug/nn/parameters.hpp"

namespace snug {

// ---- the family --------------------------------------------------------------------

template <class F>
concept FamilyBlockShape = requires { typename F::BlockShape; } && std::copyable<typename F::BlockShape>;

template <class F>
concept FamilyChannels = FamilyBlockShape<F> && requires(const typename F::BlockShape& s) {
    { F::channels(s) } -> std::convertible_to<int>;
};

template <class F>
concept FamilySwitches = requires {
    { F::learned_positions } -> std::convertible_to<bool>;
    { F::tied_head } -> std::convertible_to<bool>;
};

template <class F, class Act, class D>
concept FamilyBlockTemplate = requires { typename F::template Block<Act, D>; };

template <class F, class Act, class D>
concept FamilyFinalNormTemplate = requires { typename F::template FinalNorm<Act, D>; };

// ---- the block ---------------------------------------------------------------------

// Declares its tensors into the registry under `prefix` ("layers.3."), sized
// by the family's BlockShape.
template <class B, class Shape>
concept BlockFromRegistry = std::constructible_from<B, ParameterRegistry&, const std::string&, const Shape&>;

// Points the block at the model's buffers once they exist (nn/module.hpp).
template <class B>
concept BlockBind = LayerTypes<B> && requires(B& b, ParameterBinding<typename B::value_type> p) { b.bind(p); };

template <class B, class Shape>
concept CausalLMBlock = Layer<B> && BlockFromRegistry<B, Shape> && BlockBind<B>;

// ---- the final norm (a module on raw (N, C) rows, as RMSNorm and LayerNorm) --------

template <class N, class Act, class D>
concept FinalNormModule = requires(N& n, const N& cn, ParameterBinding<Act> p, ActivationArena<D>& keep, const D& dev,
                                   Act* out, const Act* in, std::int64_t rows) {
    n.bind(p);
    n.forward(keep, dev, out, in, rows);  // out (N, C); keeps its statistics on `keep`
    cn.backward(dev, out, in, in, rows);  // din (N, C) +=, dout, in
};

// Made by the family's final_norm(registry, name, shape) where it has one,
// else by FinalNorm(registry, name, C).
template <class F, class Act, class D>
concept FamilyMakesFinalNorm =
    requires(ParameterRegistry& r, const std::string& name, const typename F::BlockShape& s) {
        F::template final_norm<Act, D>(r, name, s);
    } || std::constructible_from<typename F::template FinalNorm<Act, D>, ParameterRegistry&, const std::string&, int>;

// ---- everything, with the first missing piece named --------------------------------

template <class F, class Act, class D>
concept CausalLMFamily =
    FamilyChannels<F> && FamilySwitches<F> && FamilyBlockTemplate<F, Act, D> && FamilyFinalNormTemplate<F, Act, D> &&
    CausalLMBlock<typename F::template Block<Act, D>, typename F::BlockShape> &&
    FinalNormModule<typename F::template FinalNorm<Act, D>, Act, D> && FamilyMakesFinalNorm<F, Act, D>;

// Asserts CausalLMFamily<F, Act, D> a requirement at a time: the first one the
// family misses fails with its own message. Returns true.
template <class F, class Act, class D>
consteval bool check_family() {
    static_assert(FamilyBlockShape<F>, "CausalLM family: needs `using BlockShape = ...;` (what one block needs)");
    if constexpr (FamilyBlockShape<F>) {
        static_assert(FamilyChannels<F>, "CausalLM family: needs `static int channels(const BlockShape&)`");
        static_assert(FamilySwitches<F>,
                      "CausalLM family: needs `static constexpr bool learned_positions` and `tied_head`");
        static_assert(FamilyBlockTemplate<F, Act, D>,
                      "CausalLM family: needs `template <class Act, snug::DeviceTag D> using Block = ...;`");
        static_assert(FamilyFinalNormTemplate<F, Act, D>,
                      "CausalLM family: needs `template <class Act, snug::DeviceTag D> using FinalNorm = ...;`");
        if constexpr (FamilyBlockTemplate<F, Act, D>) {
            using B = typename F::template Block<Act, D>;
            static_assert(LayerTypes<B>, "CausalLM block: needs `using value_type = Act;` and `using device_type = D;`");
            static_assert(LayerOutputShape<B>, "CausalLM block: needs `snug::Shape output_shape(const snug::Shape&) const`");
            static_assert(LayerForward<B>, "CausalLM block: needs `forward(Context<D>&, TensorView<const Act, D> in, "
                                           "TensorView<Act, D> out)`");
            static_assert(LayerBackward<B>, "CausalLM block: needs `backward(Context<D>&, TensorView<const Act, D> in, "
                                            "TensorView<const Act, D> dout, TensorView<Act, D> din)`");
            static_assert(BlockFromRegistry<B, typename F::BlockShape>,
                          "CausalLM block: needs a constructor (snug::ParameterRegistry&, const std::string& prefix, "
                          "const BlockShape&)");
            static_assert(BlockBind<B>, "CausalLM block: needs `void bind(snug::ParameterBinding<Act>)`");
        }
        if constexpr (FamilyFinalNormTemplate<F, Act, D>) {
            static_assert(FinalNormModule<typename F::template FinalNorm<Act, D>, Act, D>,
                          "CausalLM final norm: needs bind(ParameterBinding<Act>), forward(ActivationArena<D>&, "
                          "const D&, Act* out, const Act* in, int64 N) and backward(const D&, Act* din, "
                          "const Act* dout, const Act* in, int64 N) const");
            static_assert(FamilyMakesFinalNorm<F, Act, D>,
                          "CausalLM final norm: needs a constructor (snug::ParameterRegistry&, const std::string& "
                          "name, int channels), or the family's static final_norm<Act, D>(registry, name, "
                          "BlockShape)");
        }
    }
    return true;
}

}  // namespace snug
