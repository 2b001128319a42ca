// Naming a host allocation that fails. A model too large for the machine
// ends in std::bad_alloc (or std::length_error for a size no vector can
// hold), whose text says nothing of what was asked for; the engine runs each
// large allocation through name_allocation, which turns either into
// snug::OutOfMemory naming the allocation and its size.
#pragma once

#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>

#include "snug/core/bytes.hpp"
#include "snug/core/error.hpp"

namespace snug {

// The message: "out of host memory: cannot allocate 2.50 GiB (2684354560 bytes) for WHAT".
inline std::string host_allocation_failure(std::string_view what, std::size_t bytes) {
    return "out of host memory: cannot allocate " + format_bytes(bytes) + " (" + std::to_string(bytes) +
           " bytes) for " + std::string(what);
}

// Returns f(); a std::bad_alloc or std::length_error from it becomes
// OutOfMemory(host_allocation_failure(what, bytes)).
//   what:  what f allocates, as a reader would name it ("the initial weights of a 774M model")
//   bytes: how much f asks for in all
template <class F>
decltype(auto) name_allocation(std::string_view what, std::size_t bytes, F&& f) {
    try {
        return f();
    } catch (const std::bad_alloc&) {
        throw OutOfMemory(host_allocation_failure(what, bytes));
    } catch (const std::length_error&) {
        throw OutOfMemory(host_allocation_failure(what, bytes));
    }
}

}  // namespace snug
