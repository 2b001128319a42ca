// Host memory, asked before and named after: host_memory_room() says what
// this process can still allocate (the kernel's available memory, the room
// under its address-space limit), so a run too large for the machine is
// refused before it builds anything; and a host allocation that fails anyway
// ends in std::bad_alloc (or std::length_error for a size no vector can
// hold), whose text says nothing of what was asked for, so the engine runs
// each large allocation through name_allocation, which turns either into
// snug::OutOfMemory naming the allocation and its size.
#pragma once

#include <cstddef>
#include <cstdio>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#if defined(__linux__)
#include <sys/resource.h>
#include <unistd.h>
#endif

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

// What the host can still give this process; a figure the system does not
// tell is nullopt.
struct HostMemoryRoom {
    std::optional<std::size_t> available;            // MemAvailable (/proc/meminfo)
    std::optional<std::size_t> address_space_limit;  // RLIMIT_AS (ulimit -v), when one is set
    std::size_t address_space_used = 0;              // what the process has mapped already
    // The room under the address-space limit (nullopt: no limit).
    std::optional<std::size_t> address_space_room() const {
        if (!address_space_limit) return std::nullopt;
        return *address_space_limit > address_space_used ? *address_space_limit - address_space_used : 0;
    }
    // The smaller of the two (nullopt: neither is known).
    std::optional<std::size_t> least() const {
        const std::optional<std::size_t> room = address_space_room();
        if (available && room) return *available < *room ? *available : *room;
        return available ? available : room;
    }
    // "available memory 7.50 GiB, address-space limit 8.00 GiB (1.20 GiB of it mapped already)".
    std::string describe() const {
        std::string s;
        if (available) s = "available memory " + format_bytes(*available);
        if (address_space_limit)
            s += (s.empty() ? "" : ", ") + std::string("address-space limit ") + format_bytes(*address_space_limit) +
                 " (" + format_bytes(address_space_used) + " of it mapped already)";
        return s.empty() ? "unknown" : s;
    }
};

// This process's room now (Linux: /proc/meminfo, getrlimit, /proc/self/statm;
// elsewhere nothing is known).
inline HostMemoryRoom host_memory_room() {
    HostMemoryRoom room;
#if defined(__linux__)
    if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
        char line[256];
        unsigned long long kib = 0;
        while (std::fgets(line, sizeof line, f) != nullptr)
            if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
                room.available = static_cast<std::size_t>(kib) * 1024;
                break;
            }
        std::fclose(f);
    }
    rlimit limit{};
    if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
        room.address_space_limit = static_cast<std::size_t>(limit.rlim_cur);
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
        unsigned long long pages = 0;
        if (std::fscanf(f, "%llu", &pages) == 1)
            room.address_space_used = static_cast<std::size_t>(pages) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
        std::fclose(f);
    }
#endif
    return room;
}

}  // namespace snug
