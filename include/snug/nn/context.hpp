// Context<D>: what a layer's forward and backward need besides tensors: the
// device (and its stream), the arena that keeps activations for backward, the
// arena for backward's temporaries, and the random stream for dropout.
#pragma once

#include <cstdint>

#include "snug/core/arena.hpp"
#include "snug/core/device.hpp"

namespace snug {

template <DeviceTag D>
struct Context {
    D device;
    // Forward pushes what backward needs; backward pops it in reverse.
    ActivationArena<D>& activations;
    // Short-lived buffers of one layer's backward (MemoryCategory::temporaries).
    ActivationArena<D>& scratch;
    // Random numbers come from the stream (seed, rng_offset): a layer that
    // draws n numbers reads offsets rng_offset .. and advances rng_offset, so a
    // recomputation that restores rng_offset replays the same numbers.
    std::uint64_t seed = 0;
    std::uint64_t rng_offset = 0;
};

}  // namespace snug
