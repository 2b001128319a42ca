// Test support: the tracker, arenas and context a host-backend test needs to
// run a model, in one object.
#pragma once

#include "snug/core/arena.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/nn/context.hpp"

namespace snug::test {

struct HostRun {
    MemoryTracker tracker;
    ActivationArena<Host> activations{tracker};
    ActivationArena<Host> scratch{tracker, ActivationArena<Host>::default_chunk_bytes, MemoryCategory::temporaries};
    Context<Host> ctx{Host{}, activations, scratch};
};

}  // namespace snug::test
