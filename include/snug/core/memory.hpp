// Device memory, accounted: byte-count parsing and formatting, the
// MemoryTracker every device byte goes through, the tracked Buffer, and the
// ActivationArena the forward pass saves into. Include this for all of them.
#pragma once

#include "snug/core/arena.hpp"           // ActivationArena<D>
#include "snug/core/buffer.hpp"          // Buffer<T, D>
#include "snug/core/bytes.hpp"           // parse_bytes, format_bytes
#include "snug/core/memory_tracker.hpp"  // MemoryCategory, MemoryTracker
