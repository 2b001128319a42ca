// snug::Meter: the metering device, a third device tag beside Host and Cuda.
// Its memory is addresses without bytes: Buffers and arenas on Meter allocate
// and free exactly as on a real device, recorded by the same MemoryTracker,
// and its kernels (snug/meter/ops.hpp) do nothing. Running the real model and
// TrainStep on Meter therefore measures what they would hold — the planner's
// only memory model (train/planner.hpp) — without a byte of memory or a
// FLOP of work, whatever the model's size.
//
// A pointer Meter hands out must never be read or written: it points at no
// memory. Code that reads device memory goes through download(), a no-op here
// that leaves the host side as it was.
//
// What the device itself would reserve (every allocation, arena chunks
// included, rounded as the real device rounds them) is counted by a
// meter::Ledger opened on the calling thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/ops/fused_attention.hpp"

namespace snug::meter {

// The bytes the device would reserve, counted over the allocations made on
// this thread while the ledger is open. Each allocation is counted rounded
// up to `granularity` bytes (1 for exact bytes, 2 MiB for CUDA's pages).
// Ledgers nest; the innermost open one counts.
class Ledger {
public:
    explicit Ledger(std::size_t granularity = 1) : granularity_(granularity == 0 ? 1 : granularity), outer_(current()) {
        current() = this;
    }
    Ledger(const Ledger&) = delete;
    Ledger& operator=(const Ledger&) = delete;
    ~Ledger() { current() = outer_; }

    std::size_t live_bytes() const noexcept { return live_; }
    std::size_t peak_bytes() const noexcept { return peak_; }
    std::size_t allocations() const noexcept { return count_; }

    static Ledger* open() noexcept { return current(); }

    void record(std::uintptr_t address, std::size_t bytes) {
        const std::size_t counted = (bytes + granularity_ - 1) / granularity_ * granularity_;
        sizes_[address] = counted;
        live_ += counted;
        peak_ = std::max(peak_, live_);
        ++count_;
    }
    void forget(std::uintptr_t address) noexcept {
        const auto it = sizes_.find(address);
        if (it == sizes_.end()) return;  // allocated before this ledger opened
        live_ -= it->second;
        sizes_.erase(it);
    }

private:
    static Ledger*& current() noexcept {
        thread_local Ledger* ledger = nullptr;
        return ledger;
    }

    std::size_t granularity_;
    Ledger* outer_;
    std::unordered_map<std::uintptr_t, std::size_t> sizes_;
    std::size_t live_ = 0, peak_ = 0, count_ = 0;
};

struct OffloadLink;

struct Device {
    static constexpr const char* name = "meter";
    // The fused attention engine of the device being planned for (not owned;
    // nullptr: none): it says which calls it takes and their workspace
    // (ops/fused_attention.hpp), so the plan holds what the run will.
    FusedAttentionPlanner* fused = nullptr;
    // As cudaMalloc: so that the arenas lay out their chunks as on CUDA.
    static constexpr std::size_t alignment = 256;
    // An optimizer offloaded from the metering device (optim/offload.hpp)
    // allocates as it would from CUDA, in host memory that no ledger counts.
    using offload_link = OffloadLink;

    // A fresh, aligned, never-reused address with no memory behind it.
    static void* allocate(std::size_t bytes) {
        void* p = fresh_address(bytes);
        if (Ledger* ledger = Ledger::open(); ledger != nullptr && p != nullptr)
            ledger->record(reinterpret_cast<std::uintptr_t>(p), bytes);
        return p;
    }
    static void deallocate(void* p) noexcept {
        if (p == nullptr) return;
        if (Ledger* ledger = Ledger::open()) ledger->forget(reinterpret_cast<std::uintptr_t>(p));
    }
    void synchronize() const noexcept {}

protected:
    // A fresh, aligned, never-reused address (nullptr for 0 bytes).
    static void* fresh_address(std::size_t bytes) {
        if (bytes == 0) return nullptr;
        std::uintptr_t& next = next_address();
        const std::size_t span = (bytes + alignment - 1) / alignment * alignment;
        if (span < bytes || next > UINTPTR_MAX - span)
            throw OutOfMemory("out of memory: a meter allocation of " + std::to_string(bytes) +
                              " bytes exceeds the address space");
        const std::uintptr_t address = next;
        next += span;
        return reinterpret_cast<void*>(address);
    }

private:
    // Addresses start well away from null so that a stray read faults loudly.
    static std::uintptr_t& next_address() noexcept {
        thread_local std::uintptr_t next = std::uintptr_t{1} << 44;
        return next;
    }
};

// Host memory seen from the metering device: addresses without bytes, like
// Device's, that no Ledger counts (the device does not reserve them). An
// offloaded optimizer's state and staging live here when the planner runs
// it; Meter's kernels accept it as a Device.
struct HostMemory : Device {
    static constexpr const char* name = "meter (host memory)";
    static void* allocate(std::size_t bytes) { return fresh_address(bytes); }
    static void deallocate(void*) noexcept {}
};

// The offload link of the metering device: CUDA's protocol
// (cuda/offload_link.hpp), moving nothing.
struct OffloadLink {
    using host_device = HostMemory;
    using pinned_device = HostMemory;
    static constexpr bool shares_memory = false;
    static constexpr int slots = 2;
    void begin(const Device&) {}
    template <class T>
    void download(int, T*, const T*, std::int64_t) {}
    void wait(int) {}
    template <class T>
    void upload(T*, const T*, std::int64_t) {}
    void end(const Device&) {}
};

}  // namespace snug::meter

namespace snug {

using Meter = meter::Device;

static_assert(DeviceTag<Meter>);

}  // namespace snug
