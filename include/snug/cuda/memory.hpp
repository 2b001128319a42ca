// What the CUDA driver says about device memory, and the MemoryTracker report
// completed with it: the bytes the tracker cannot see (CUDA context, library
// workspaces, allocation rounding, activation-arena chunks not yet used).
#pragma once

#include "snug/cuda/runtime.hpp"

#include <cstddef>
#include <source_location>
#include <string>

#include "snug/core/bytes.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/cuda/check.hpp"

namespace snug::cuda {

// The current device's memory as the driver counts it (cudaMemGetInfo).
// `used` = total - free, and includes every process on that GPU, not just this one.
struct DriverMemory {
    std::size_t free = 0;
    std::size_t total = 0;
    std::size_t used = 0;
};

// Asks the driver now; throws CudaError if it cannot answer (NoCudaDevice-like
// failures included: call require_device() first for the friendlier message).
inline DriverMemory driver_memory(std::source_location loc = std::source_location::current()) {
    std::size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), loc);
    return DriverMemory{free, total, total - free};
}

// tracker.report(), then two lines from the driver:
//   driver: 1.23 GiB used of 11.50 GiB (10.27 GiB free)
//   not seen by the tracker: 523.00 MiB (context, library workspaces, arena slack, other processes)
inline std::string report_with_driver(const MemoryTracker& tracker,
                                      std::source_location loc = std::source_location::current()) {
    const DriverMemory driver = driver_memory(loc);
    const std::size_t tracked = tracker.current_total();
    std::string out = tracker.report();
    out += "driver: " + format_bytes(driver.used) + " used of " + format_bytes(driver.total) + " (" +
           format_bytes(driver.free) + " free)\n";
    if (driver.used >= tracked)
        out += "not seen by the tracker: " + format_bytes(driver.used - tracked) +
               " (context, library workspaces, allocation rounding, arena slack, other processes)\n";
    else  // tracked memory on another device, or a bookkeeping bug
        out += "the tracker holds " + format_bytes(tracked - driver.used) +
               " more than the driver reports in use on this device\n";
    return out;
}

}  // namespace snug::cuda
