// MemoryTracker: the ledger every device byte goes through, by category,
// with current and peak figures and an optional budget that turns an
// allocation past it into snug::OutOfMemory (how a 12 GiB card is emulated on
// a larger one, and how host tests check memory claims to the byte).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "snug/core/bytes.hpp"
#include "snug/core/error.hpp"

namespace snug {

// What a block of device memory holds. The order is the order of reports.
enum class MemoryCategory : std::uint8_t {
    parameters,       // the weights the forward pass reads (working precision)
    master_weights,   // fp32 copies kept by mixed precision for the update
    gradients,        // one per parameter, accumulated over micro-batches
    optimizer_state,  // e.g. AdamW's first and second moments
    activations,      // what the forward pass saves for the backward pass
    workspace,        // library scratch space (cuBLASLt), long-lived
    temporaries,      // short-lived scratch inside one operation
};

inline constexpr std::size_t memory_category_count = 7;

// Every category, in report order, for range-for loops.
inline constexpr std::array<MemoryCategory, memory_category_count> all_memory_categories{
    MemoryCategory::parameters,      MemoryCategory::master_weights, MemoryCategory::gradients,
    MemoryCategory::optimizer_state, MemoryCategory::activations,    MemoryCategory::workspace,
    MemoryCategory::temporaries,
};

// The category as reports write it: "parameters", "master weights", ...
constexpr std::string_view category_name(MemoryCategory category) {
    switch (category) {
        case MemoryCategory::parameters: return "parameters";
        case MemoryCategory::master_weights: return "master weights";
        case MemoryCategory::gradients: return "gradients";
        case MemoryCategory::optimizer_state: return "optimizer state";
        case MemoryCategory::activations: return "activations";
        case MemoryCategory::workspace: return "workspace";
        case MemoryCategory::temporaries: return "temporaries";
    }
    return "unknown";
}

// Bytes per category, indexed by static_cast<std::size_t>(category).
using MemoryBreakdown = std::array<std::size_t, memory_category_count>;

// Records logical allocations by category and enforces an optional budget.
//
// - Sizes are the exact byte counts requested (no rounding), so tests can
//   assert them to the byte. The device allocation behind a record may be
//   rounded up to the device's alignment (64 B on the host, 256 B or more
//   under cudaMalloc), and the activation arena reserves whole chunks; those
//   differences are not tracked here. On CUDA the report adds what the
//   tracker cannot see (context, library workspaces, rounding, arena chunks)
//   from the driver's free-memory figure.
// - The budget applies to the sum over all categories: an allocate() that
//   would take current_total() past it throws OutOfMemory before anything is
//   recorded.
// - Not thread-safe: one tracker belongs to one training loop (one host
//   thread issuing the work, however many streams it uses).
// - Neither copyable nor movable: buffers and arenas point at it, and it must
//   outlive them.
class MemoryTracker {
public:
    explicit MemoryTracker(std::optional<std::size_t> budget = std::nullopt) : budget_(budget) {}
    MemoryTracker(const MemoryTracker&) = delete;
    MemoryTracker& operator=(const MemoryTracker&) = delete;

    std::optional<std::size_t> budget() const noexcept { return budget_; }

    // Sets or removes (nullopt) the budget. A budget below what is already
    // allocated throws OutOfMemory with the breakdown and keeps the old one.
    void set_budget(std::optional<std::size_t> budget) {
        if (budget && current_total_ > *budget)
            throw OutOfMemory("out of memory: the new budget " + describe(*budget) + " is below the " +
                              describe(current_total_) + " already allocated\n" + report());
        budget_ = budget;
    }

    // Bytes that may still be allocated under the budget (nullopt: no budget).
    std::optional<std::size_t> headroom() const noexcept {
        if (!budget_) return std::nullopt;
        return *budget_ - current_total_;
    }

    // Records `bytes` more in `category` for the allocation named `what`, or
    // throws OutOfMemory (recording nothing) when that would pass the budget.
    void allocate(MemoryCategory category, std::size_t bytes, std::string_view what) {
        bool over_budget = budget_ && bytes > *budget_ - current_total_;
        bool overflow = bytes > std::numeric_limits<std::size_t>::max() - current_total_;
        if (over_budget || overflow) {
            std::string message = "out of memory: \"" + std::string(what) + "\" asks for " + describe(bytes) +
                                  " of " + std::string(category_name(category)) + ", but ";
            if (budget_)
                message += describe(current_total_) + " of the " + describe(*budget_) + " budget is in use (" +
                           format_bytes(*budget_ - current_total_) + " free)\n";
            else
                message += "the total would pass SIZE_MAX\n";
            throw OutOfMemory(message + report());
        }
        std::size_t& now = current_[index(category)];
        now += bytes;
        if (now > peak_[index(category)]) peak_[index(category)] = now;
        current_total_ += bytes;
        if (current_total_ > peak_total_) {
            peak_total_ = current_total_;
            peak_breakdown_ = current_;
            peak_what_.assign(what.data(), what.size());
        }
    }

    // Forgets `bytes` of `category`. Releasing more than that category holds
    // is a bookkeeping bug: it throws snug::Error and changes nothing.
    void release(MemoryCategory category, std::size_t bytes) {
        std::size_t& now = current_[index(category)];
        if (bytes > now)
            throw Error("MemoryTracker::release: " + describe(bytes) + " of " +
                        std::string(category_name(category)) + " released, but only " + describe(now) +
                        " is recorded there");
        now -= bytes;
        current_total_ -= bytes;
    }

    std::size_t current(MemoryCategory category) const noexcept { return current_[index(category)]; }
    std::size_t peak(MemoryCategory category) const noexcept { return peak_[index(category)]; }
    std::size_t current_total() const noexcept { return current_total_; }
    // The highest the sum over categories has been (not the sum of peaks).
    std::size_t peak_total() const noexcept { return peak_total_; }
    const MemoryBreakdown& current_breakdown() const noexcept { return current_; }
    // Each category's current value at the moment the total first reached
    // peak_total() (a later equal total does not replace it).
    const MemoryBreakdown& peak_breakdown() const noexcept { return peak_breakdown_; }
    // The allocation that brought the total to peak_total() ("" before any).
    const std::string& peak_allocation() const noexcept { return peak_what_; }

    // Starts a new measurement window: every peak becomes the current value.
    void reset_peaks() noexcept {
        peak_ = current_;
        peak_total_ = current_total_;
        peak_breakdown_ = current_;
        peak_what_.clear();
    }

    // A table: per category the current bytes, the peak, and the share of
    // the total peak; then the totals and the budget.
    std::string report() const {
        constexpr int name_width = 16;
        constexpr int column_width = 15;
        std::ostringstream out;
        out << std::left << std::setw(name_width) << "category" << std::right << std::setw(column_width)
            << "current" << std::setw(column_width) << "peak" << std::setw(column_width) << "at total peak"
            << '\n';
        for (MemoryCategory category : all_memory_categories) {
            std::size_t i = index(category);
            out << std::left << std::setw(name_width) << category_name(category) << std::right
                << std::setw(column_width) << format_bytes(current_[i]) << std::setw(column_width)
                << format_bytes(peak_[i]) << std::setw(column_width) << format_bytes(peak_breakdown_[i])
                << '\n';
        }
        out << std::left << std::setw(name_width) << "total" << std::right << std::setw(column_width)
            << format_bytes(current_total_) << std::setw(column_width) << format_bytes(peak_total_)
            << std::setw(column_width) << format_bytes(peak_total_) << '\n';
        if (budget_)
            out << "budget " << describe(*budget_) << ", " << format_bytes(*budget_ - current_total_)
                << " free\n";
        else
            out << "budget: none\n";
        return out.str();
    }

private:
    static constexpr std::size_t index(MemoryCategory category) noexcept {
        return static_cast<std::size_t>(category);
    }
    // "2.00 GiB (2147483648 bytes)": readable, and exact for a test to find.
    static std::string describe(std::size_t bytes) {
        if (bytes < 1024) return format_bytes(bytes);
        return format_bytes(bytes) + " (" + std::to_string(bytes) + " bytes)";
    }

    std::optional<std::size_t> budget_;
    MemoryBreakdown current_{};
    MemoryBreakdown peak_{};
    MemoryBreakdown peak_breakdown_{};
    std::string peak_what_;
    std::size_t current_total_ = 0;
    std::size_t peak_total_ = 0;
};

}  // namespace snug
