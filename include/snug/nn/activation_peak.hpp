// predict_activation_peak(model, B, T, modes): the activation bytes one
// forward + backward of `model` at (B, T) holds at its highest under a
// recompute plan, measured by running the model's own code on snug::Meter
// (no memory, no work), so it is right by construction for any model —
// GPT or a user's — that names its Meter twin:
//
//   template <snug::DeviceTag E> using on_device = MyModel<Act, E>;
//   const MyConfig& config() const;          // and MyModel(config, tracker)
//
// The checkpoint policies ask this (CheckpointQuery::activation_peak) to
// choose a plan before anything is allocated.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "snug/core/arena.hpp"
#include "snug/core/buffer.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/meter/device.hpp"
#include "snug/nn/context.hpp"
#include "snug/nn/layer_stack.hpp"

namespace snug {

// A model with a twin on another device tag, built from its configuration.
template <class M>
concept MeterableModel = requires(const M& m) {
    typename M::template on_device<Meter>;
    m.config();
    requires std::constructible_from<typename M::template on_device<Meter>, decltype(m.config()), MemoryTracker&>;
};

// The activation peak of the Meter model built from `config`, over one
// training forward (with targets) and backward at (B, T) under `modes`.
template <class MeterModel, class Config>
std::size_t metered_activation_peak(const Config& config, int B, int T, std::span<const Recompute> modes) {
    MemoryTracker tracker;
    ActivationArena<Meter> activations(tracker);
    ActivationArena<Meter> scratch(tracker, ActivationArena<Meter>::default_chunk_bytes, MemoryCategory::temporaries);
    MeterModel model(config, tracker);
    const std::size_t n = B > 0 && T > 0 ? static_cast<std::size_t>(B) * static_cast<std::size_t>(T) : 0;
    Buffer<std::int32_t, Meter> ids(tracker, MemoryCategory::workspace, n, "token ids");
    Context<Meter> ctx{Meter{}, activations, scratch};
    model.set_recompute(modes);
    (void)model.forward(ctx, ids.data(), ids.data(), B, T, 1.0f);
    model.backward(ctx, ids.data());
    return tracker.peak(MemoryCategory::activations);
}

template <MeterableModel M>
std::size_t predict_activation_peak(const M& model, int B, int T, std::span<const Recompute> modes) {
    return metered_activation_peak<typename M::template on_device<Meter>>(model.config(), B, T, modes);
}

}  // namespace snug
