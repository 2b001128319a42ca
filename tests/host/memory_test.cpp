// Tests for snug/core/memory.hpp: byte strings, the MemoryTracker's ledger and
// budget, Buffer's RAII, and the ActivationArena's stack discipline. Every
// expected byte count is derived by hand in the comments next to it.
#include "snug/core/memory.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace {

using snug::MemoryCategory;
using snug::MemoryTracker;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

// The message of the E that f throws; fails the test if it throws nothing
// (any other exception type escapes and fails the test too).
template <class E, class F>
std::string message_of(F&& f) {
    try {
        f();
    } catch (const E& e) {
        return e.what();
    }
    FAIL("expected an exception, none was thrown");
    return {};
}

// A host device that counts what it is asked for and can be told to fail.
struct CountingDevice {
    static constexpr const char* name = "counting";
    static constexpr std::size_t alignment = 64;
    static inline int allocations = 0;
    static inline int live = 0;
    static inline std::size_t bytes_requested = 0;
    static inline bool fail = false;

    static void* allocate(std::size_t bytes) {
        if (fail) throw std::bad_alloc();
        ++allocations;
        ++live;
        bytes_requested += bytes;
        return snug::Host::allocate(bytes);
    }
    static void deallocate(void* p) noexcept {
        if (p != nullptr) --live;
        snug::Host::deallocate(p);
    }
    void synchronize() const noexcept {}

    static void reset() {
        allocations = 0;
        live = 0;
        bytes_requested = 0;
        fail = false;
    }
};
static_assert(snug::DeviceTag<CountingDevice>);

bool aligned_to(const void* p, std::size_t alignment) {
    return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

void require_all_zero(const MemoryTracker& tracker) {
    for (MemoryCategory c : snug::all_memory_categories) REQUIRE(tracker.current(c) == 0);
    REQUIRE(tracker.current_total() == 0);
}

}  // namespace

// ---------------------------------------------------------------- bytes ----

TEST_CASE("parse_bytes reads binary, decimal and plain byte counts", "[memory][bytes]") {
    using snug::parse_bytes;
    CHECK(parse_bytes("12GiB") == 12ull << 30);
    CHECK(parse_bytes("512MiB") == 512ull << 20);
    CHECK(parse_bytes("64KiB") == 64ull << 10);
    CHECK(parse_bytes("1TiB") == 1ull << 40);
    CHECK(parse_bytes("2PiB") == 2ull << 50);
    CHECK(parse_bytes("15EiB") == 15ull << 60);
    CHECK(parse_bytes("1.5GiB") == (1ull << 30) + (1ull << 29));
    CHECK(parse_bytes("0.25MiB") == 1ull << 18);
    CHECK(parse_bytes("100MB") == 100'000'000ull);
    CHECK(parse_bytes("1kB") == 1000ull);
    CHECK(parse_bytes("2GB") == 2'000'000'000ull);
    CHECK(parse_bytes("3TB") == 3'000'000'000'000ull);
    CHECK(parse_bytes("1.5kB") == 1500ull);
    CHECK(parse_bytes("1024") == 1024ull);
    CHECK(parse_bytes("0") == 0ull);
    CHECK(parse_bytes("17B") == 17ull);
    CHECK(parse_bytes("007KiB") == 7ull << 10);
    CHECK(parse_bytes("18446744073709551615") == std::numeric_limits<std::uint64_t>::max());
    // One space before the unit, as format_bytes writes it.
    CHECK(parse_bytes("11.50 GiB") == (11ull << 30) + (1ull << 29));
    CHECK(parse_bytes("512 MiB") == 512ull << 20);
}

TEST_CASE("parse_bytes rounds a fraction to the nearest byte", "[memory][bytes]") {
    using snug::parse_bytes;
    // 0.1 * 1024 = 102.4 -> 102
    CHECK(parse_bytes("0.1KiB") == 102ull);
    // 0.7 * 1024 = 716.8 -> 717
    CHECK(parse_bytes("0.7KiB") == 717ull);
    // 1.0005 * 1000 = 1000.5 -> 1001 (half up)
    CHECK(parse_bytes("1.0005kB") == 1001ull);
    // round(1.123456789 * 2^30) = round(1206302541.806...) (exact fractions in Python)
    CHECK(parse_bytes("1.123456789GiB") == 1206302542ull);
    // round(2.718281828 * 2^60): 2^60 * 2.718281828 needs more than 64 bits on the way
    CHECK(parse_bytes("2.718281828EiB") == 3133965575083210419ull);
}

TEST_CASE("parse_bytes rejects malformed strings with a ConfigError naming them", "[memory][bytes]") {
    const std::vector<std::string> bad{
        "",       "12 gigs",  "-1GiB",   "+1GiB",     " 12GiB", "12GiB ", "12  GiB",
        "12gib",  "12GIB",    "12mb",    "12KB",      "12G",    "1.5",    "1.5B",
        "1.GiB",  ".5GiB",    "GiB",     "1e9",       "12 ",    "1,5GiB", "1.5.5GiB",
        "0x10",   "1.1234567891GiB",     "18446744073709551616", "99999999999999999999",
        "16EiB",  "17179869184GiB",      "18446744073709551616B",
    };
    for (const std::string& text : bad) {
        INFO("input: \"" << text << "\"");
        std::string message = message_of<snug::ConfigError>([&] { (void)snug::parse_bytes(text); });
        CHECK(message.find("\"" + text + "\"") != std::string::npos);
    }
    // The reason is named too.
    CHECK(message_of<snug::ConfigError>([] { (void)snug::parse_bytes("12 gigs"); }).find("unknown unit \"gigs\"") !=
          std::string::npos);
    CHECK(message_of<snug::ConfigError>([] { (void)snug::parse_bytes("16EiB"); }).find("too large") !=
          std::string::npos);
}

TEST_CASE("format_bytes writes exact bytes below 1 KiB and two decimals above", "[memory][bytes]") {
    using snug::format_bytes;
    CHECK(format_bytes(0) == "0 B");
    CHECK(format_bytes(17) == "17 B");
    CHECK(format_bytes(1023) == "1023 B");
    CHECK(format_bytes(1024) == "1.00 KiB");
    CHECK(format_bytes(1536) == "1.50 KiB");
    CHECK(format_bytes(512 * MiB) == "512.00 MiB");
    CHECK(format_bytes(11 * GiB + GiB / 2) == "11.50 GiB");
    CHECK(format_bytes(12 * GiB) == "12.00 GiB");
    // 1 MiB - 1 byte is 1023.999 KiB: two decimals round it to the next unit.
    CHECK(format_bytes(MiB - 1) == "1.00 MiB");
    // 2^64 - 1 bytes is 16 EiB less one byte.
    CHECK(format_bytes(std::numeric_limits<std::size_t>::max()) == "16.00 EiB");
    // What format_bytes writes, parse_bytes reads.
    CHECK(snug::parse_bytes(format_bytes(11 * GiB + GiB / 2)) == 11 * GiB + GiB / 2);
}

// --------------------------------------------------------------- tracker ----

TEST_CASE("memory categories have names and a count", "[memory][tracker]") {
    STATIC_REQUIRE(snug::memory_category_count == 7);
    CHECK(snug::category_name(MemoryCategory::parameters) == "parameters");
    CHECK(snug::category_name(MemoryCategory::master_weights) == "master weights");
    CHECK(snug::category_name(MemoryCategory::gradients) == "gradients");
    CHECK(snug::category_name(MemoryCategory::optimizer_state) == "optimizer state");
    CHECK(snug::category_name(MemoryCategory::activations) == "activations");
    CHECK(snug::category_name(MemoryCategory::workspace) == "workspace");
    CHECK(snug::category_name(MemoryCategory::temporaries) == "temporaries");
    for (std::size_t i = 0; i < snug::memory_category_count; ++i)
        CHECK(static_cast<std::size_t>(snug::all_memory_categories[i]) == i);
}

TEST_CASE("an allocation over the budget throws OutOfMemory and records nothing", "[memory][tracker]") {
    MemoryTracker tracker(GiB);
    tracker.allocate(MemoryCategory::parameters, 768 * MiB, "embedding");
    tracker.allocate(MemoryCategory::gradients, 64 * MiB, "embedding.grad");
    tracker.release(MemoryCategory::gradients, 64 * MiB);
    // 768 MiB in use; 256 MiB free; ask for 512 MiB of activations.
    std::string message = message_of<snug::OutOfMemory>(
        [&] { tracker.allocate(MemoryCategory::activations, 512 * MiB, "attention scores"); });
    INFO(message);
    CHECK(message.find("attention scores") != std::string::npos);
    CHECK(message.find("512.00 MiB") != std::string::npos);
    CHECK(message.find("536870912") != std::string::npos);   // 512 * 2^20, the request to the byte
    CHECK(message.find("1.00 GiB") != std::string::npos);    // the budget
    CHECK(message.find("1073741824") != std::string::npos);  // 2^30, the budget to the byte
    CHECK(message.find("768.00 MiB") != std::string::npos);  // in use
    CHECK(message.find("256.00 MiB free") != std::string::npos);
    CHECK(message.find("64.00 MiB") != std::string::npos);   // the gradients' peak
    for (MemoryCategory c : snug::all_memory_categories)
        CHECK(message.find(std::string(snug::category_name(c))) != std::string::npos);
    CHECK(message.find("total") != std::string::npos);

    CHECK(tracker.current(MemoryCategory::activations) == 0);
    CHECK(tracker.peak(MemoryCategory::activations) == 0);
    CHECK(tracker.current_total() == 768 * MiB);
    CHECK(tracker.peak_total() == 832 * MiB);  // 768 + 64, before the release
    REQUIRE(tracker.headroom() == 256 * MiB);

    // Exactly the rest fits; one byte more does not.
    tracker.allocate(MemoryCategory::activations, 256 * MiB, "fits exactly");
    CHECK(tracker.current_total() == GiB);
    CHECK(tracker.headroom() == 0u);
    CHECK_THROWS_AS(tracker.allocate(MemoryCategory::temporaries, 1, "one byte"), snug::OutOfMemory);
    CHECK(tracker.current(MemoryCategory::temporaries) == 0);
    CHECK(tracker.current_total() == GiB);
}

TEST_CASE("without a budget only an overflow of the total is refused", "[memory][tracker]") {
    MemoryTracker tracker;
    CHECK_FALSE(tracker.budget().has_value());
    CHECK_FALSE(tracker.headroom().has_value());
    const std::size_t max = std::numeric_limits<std::size_t>::max();
    tracker.allocate(MemoryCategory::parameters, max - 10, "nearly everything");
    tracker.allocate(MemoryCategory::workspace, 10, "the rest");
    CHECK_THROWS_AS(tracker.allocate(MemoryCategory::workspace, 1, "past SIZE_MAX"), snug::OutOfMemory);
    CHECK(tracker.current(MemoryCategory::workspace) == 10);
    CHECK(tracker.current_total() == max);
}

TEST_CASE("current and peak are exact per category and peak_total is the peak of the sum",
          "[memory][tracker]") {
    MemoryTracker tracker;
    using C = MemoryCategory;
    //                                            P     G    A    T   total
    tracker.allocate(C::parameters, 1000, "p");  // 1000  0    0    0   1000
    tracker.allocate(C::gradients, 300, "g");    // 1000 300   0    0   1300
    tracker.allocate(C::activations, 500, "a");  // 1000 300  500   0   1800
    tracker.release(C::activations, 200);        // 1000 300  300   0   1600
    tracker.allocate(C::temporaries, 400, "t");  // 1000 300  300  400  2000
    CHECK(tracker.peak_total() == 2000);
    tracker.release(C::temporaries, 400);        // 1000 300  300   0   1600
    tracker.allocate(C::activations, 600, "a2"); // 1000 300  900   0   2200  <- the peak of the sum
    tracker.release(C::gradients, 300);          // 1000  0   900   0   1900
    tracker.release(C::activations, 900);        // 1000  0    0    0   1000
    tracker.allocate(C::temporaries, 1100, "t2");// 1000  0    0  1100  2100

    CHECK(tracker.current(C::parameters) == 1000);
    CHECK(tracker.current(C::gradients) == 0);
    CHECK(tracker.current(C::activations) == 0);
    CHECK(tracker.current(C::temporaries) == 1100);
    CHECK(tracker.current(C::master_weights) == 0);
    CHECK(tracker.current_total() == 2100);

    CHECK(tracker.peak(C::parameters) == 1000);
    CHECK(tracker.peak(C::gradients) == 300);
    CHECK(tracker.peak(C::activations) == 900);
    CHECK(tracker.peak(C::temporaries) == 1100);
    CHECK(tracker.peak(C::optimizer_state) == 0);
    // The sum of the peaks is 3300; the total never went above 2200.
    CHECK(tracker.peak_total() == 2200);

    const snug::MemoryBreakdown at_peak = tracker.peak_breakdown();
    const snug::MemoryBreakdown expected{1000, 0, 300, 0, 900, 0, 0};
    CHECK(at_peak == expected);
    std::size_t sum = 0;
    for (std::size_t b : at_peak) sum += b;
    CHECK(sum == 2200);

    SECTION("reset_peaks starts a new window at the current values") {
        tracker.reset_peaks();
        for (C c : snug::all_memory_categories) CHECK(tracker.peak(c) == tracker.current(c));
        CHECK(tracker.peak(C::activations) == 0);
        CHECK(tracker.peak(C::temporaries) == 1100);
        CHECK(tracker.peak_total() == 2100);
        CHECK(tracker.peak_breakdown() == snug::MemoryBreakdown{1000, 0, 0, 0, 0, 0, 1100});
        tracker.allocate(C::activations, 50, "a3");  // total 2150
        tracker.release(C::activations, 50);          // total 2100
        CHECK(tracker.peak(C::activations) == 50);
        CHECK(tracker.peak_total() == 2150);
        CHECK(tracker.peak_breakdown() == snug::MemoryBreakdown{1000, 0, 0, 0, 50, 0, 1100});
    }
    SECTION("the report is a table with every category, the totals and the budget") {
        std::string report = tracker.report();
        INFO(report);
        for (C c : snug::all_memory_categories)
            CHECK(report.find(std::string(snug::category_name(c))) != std::string::npos);
        CHECK(report.find("total") != std::string::npos);
        CHECK(report.find("2.05 KiB") != std::string::npos);  // current total 2100 / 1024 = 2.0508
        CHECK(report.find("2.15 KiB") != std::string::npos);  // peak total 2200 / 1024 = 2.1484
        CHECK(report.find("900 B") != std::string::npos);      // the activation peak
        CHECK(report.find("budget: none") != std::string::npos);
        tracker.set_budget(4 * KiB);
        CHECK(tracker.report().find("budget 4.00 KiB (4096 bytes), 1.95 KiB free") != std::string::npos);
    }
}

TEST_CASE("peak_breakdown keeps the first moment the peak was reached", "[memory][tracker]") {
    MemoryTracker tracker;
    tracker.allocate(MemoryCategory::parameters, 100, "p");
    tracker.allocate(MemoryCategory::activations, 50, "a");  // total 150: the peak
    tracker.release(MemoryCategory::activations, 50);
    tracker.allocate(MemoryCategory::gradients, 50, "g");    // total 150 again, not higher
    CHECK(tracker.peak_total() == 150);
    CHECK(tracker.peak_breakdown() == snug::MemoryBreakdown{100, 0, 0, 0, 50, 0, 0});
}

TEST_CASE("releasing more than a category holds is an error that changes nothing", "[memory][tracker]") {
    MemoryTracker tracker;
    tracker.allocate(MemoryCategory::gradients, 100, "g");
    tracker.allocate(MemoryCategory::parameters, 1000, "p");
    std::string message = message_of<snug::Error>([&] { tracker.release(MemoryCategory::gradients, 101); });
    CHECK(message.find("gradients") != std::string::npos);
    CHECK(message.find("101 B") != std::string::npos);
    CHECK(message.find("100 B") != std::string::npos);
    CHECK_THROWS_AS(tracker.release(MemoryCategory::workspace, 1), snug::Error);
    CHECK(tracker.current(MemoryCategory::gradients) == 100);
    CHECK(tracker.current(MemoryCategory::workspace) == 0);
    CHECK(tracker.current_total() == 1100);
}

TEST_CASE("set_budget refuses a budget below what is allocated", "[memory][tracker]") {
    MemoryTracker tracker(2 * KiB);
    tracker.allocate(MemoryCategory::parameters, 1500, "p");
    std::string message = message_of<snug::OutOfMemory>([&] { tracker.set_budget(KiB); });
    CHECK(message.find("1.00 KiB") != std::string::npos);
    CHECK(message.find("1500") != std::string::npos);
    CHECK(tracker.budget() == 2 * KiB);
    tracker.set_budget(1500);  // exactly what is in use
    CHECK(tracker.headroom() == 0u);
    tracker.set_budget(std::nullopt);
    tracker.allocate(MemoryCategory::parameters, GiB, "no budget now");
    CHECK(tracker.current_total() == GiB + 1500);
}

// ---------------------------------------------------------------- buffer ----

TEST_CASE("Buffer records its bytes while it lives", "[memory][buffer]") {
    MemoryTracker tracker;
    {
        snug::Buffer<float, snug::Host> weights(tracker, MemoryCategory::parameters, 1000, "w");
        CHECK(weights.size() == 1000);
        CHECK(weights.bytes() == 4000);
        CHECK(weights.category() == MemoryCategory::parameters);
        CHECK_FALSE(weights.empty());
        REQUIRE(weights.data() != nullptr);
        CHECK(aligned_to(weights.data(), snug::Host::alignment));
        CHECK(tracker.current(MemoryCategory::parameters) == 4000);
        for (std::size_t i = 0; i < weights.size(); ++i) weights.data()[i] = static_cast<float>(i) * 0.5f;
        CHECK(weights.data()[999] == 499.5f);

        snug::Buffer<double, snug::Host> grads(tracker, MemoryCategory::gradients, 10, "w.grad");
        CHECK(tracker.current(MemoryCategory::gradients) == 80);
        CHECK(tracker.current_total() == 4080);
    }
    require_all_zero(tracker);
    CHECK(tracker.peak_total() == 4080);
}

TEST_CASE("Buffer moves hand over the record, move-assignment frees the old one", "[memory][buffer]") {
    CountingDevice::reset();
    MemoryTracker tracker;
    {
        using B = snug::Buffer<float, CountingDevice>;
        B a(tracker, MemoryCategory::parameters, 100, "a");  // 400 B
        B b(tracker, MemoryCategory::parameters, 30, "b");   // 120 B
        CHECK(tracker.current(MemoryCategory::parameters) == 520);
        CHECK(CountingDevice::live == 2);
        float* b_data = b.data();

        a = std::move(b);
        CHECK(tracker.current(MemoryCategory::parameters) == 120);
        CHECK(CountingDevice::live == 1);
        CHECK(a.size() == 30);
        CHECK(a.data() == b_data);
        CHECK(b.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
        CHECK(b.data() == nullptr);

        B c(std::move(a));
        CHECK(c.data() == b_data);
        CHECK(a.empty());  // NOLINT(bugprone-use-after-move)
        CHECK(tracker.current(MemoryCategory::parameters) == 120);

        c.reset();
        CHECK(c.empty());
        CHECK(tracker.current(MemoryCategory::parameters) == 0);
        CHECK(CountingDevice::live == 0);

        B d(tracker, MemoryCategory::workspace, 8, "d");
        d = B{};  // assigning an empty buffer releases d's storage
        CHECK(tracker.current(MemoryCategory::workspace) == 0);
    }
    require_all_zero(tracker);
    CHECK(CountingDevice::live == 0);
    CHECK(tracker.peak(MemoryCategory::parameters) == 520);
}

TEST_CASE("an empty Buffer is allowed", "[memory][buffer]") {
    MemoryTracker tracker(0);
    snug::Buffer<int, snug::Host> none(tracker, MemoryCategory::temporaries, 0, "nothing");
    CHECK(none.empty());
    CHECK(none.size() == 0);
    CHECK(none.bytes() == 0);
    CHECK(none.data() == nullptr);
    CHECK(tracker.current_total() == 0);
    snug::Buffer<int, snug::Host> defaulted;
    CHECK(defaulted.empty());
}

TEST_CASE("Buffer over the budget throws and leaves the tracker unchanged", "[memory][buffer]") {
    CountingDevice::reset();
    MemoryTracker tracker(1000);
    snug::Buffer<double, CountingDevice> kept(tracker, MemoryCategory::parameters, 100, "kept");  // 800 B
    // 26 doubles = 208 B; 800 + 208 > 1000.
    std::string message = message_of<snug::OutOfMemory>(
        [&] { snug::Buffer<double, CountingDevice> big(tracker, MemoryCategory::optimizer_state, 26, "adam.m"); });
    CHECK(message.find("adam.m") != std::string::npos);
    CHECK(message.find("208 B") != std::string::npos);
    CHECK(tracker.current_total() == 800);
    CHECK(tracker.current(MemoryCategory::optimizer_state) == 0);
    CHECK(tracker.peak(MemoryCategory::optimizer_state) == 0);
    CHECK(CountingDevice::allocations == 1);  // the over-budget buffer never reached the device

    // An element count whose byte size does not fit size_t.
    const std::size_t huge = std::numeric_limits<std::size_t>::max() / sizeof(float) + 1;
    CHECK_THROWS_AS((snug::Buffer<float, CountingDevice>(tracker, MemoryCategory::temporaries, huge, "huge")),
                    snug::OutOfMemory);
    CHECK(tracker.current_total() == 800);
    CHECK(CountingDevice::allocations == 1);
}

TEST_CASE("Buffer undoes its record when the device allocation fails", "[memory][buffer]") {
    CountingDevice::reset();
    MemoryTracker tracker(GiB);
    CountingDevice::fail = true;
    CHECK_THROWS_AS((snug::Buffer<float, CountingDevice>(tracker, MemoryCategory::gradients, 64, "g")),
                    std::bad_alloc);
    CountingDevice::fail = false;
    require_all_zero(tracker);  // (the peak may show the undone record; current must not)
    snug::Buffer<float, CountingDevice> ok(tracker, MemoryCategory::gradients, 64, "g");
    CHECK(tracker.current(MemoryCategory::gradients) == 256);
}

// ----------------------------------------------------------------- arena ----

TEST_CASE("ActivationArena pushes and pops in stack order", "[memory][arena]") {
    MemoryTracker tracker;
    snug::ActivationArena<snug::Host> arena(tracker, 4 * KiB);
    CHECK(arena.depth() == 0);
    CHECK(arena.reserved_bytes() == 0);  // chunks come lazily

    float* a = arena.push<float>(100, "a");   // 400 B
    float* b = arena.push<float>(50, "b");    // 200 B
    double* c = arena.push<double>(10, "c");  // 80 B
    CHECK(arena.depth() == 3);
    CHECK(arena.live_bytes() == 680);
    CHECK(tracker.current(MemoryCategory::activations) == 680);
    CHECK(tracker.current_total() == 680);
    // Different, non-overlapping, 256-aligned.
    for (const void* p : {static_cast<const void*>(a), static_cast<const void*>(b), static_cast<const void*>(c)})
        CHECK(aligned_to(p, 256));
    CHECK(reinterpret_cast<std::uintptr_t>(b) >= reinterpret_cast<std::uintptr_t>(a) + 400);
    CHECK(reinterpret_cast<std::uintptr_t>(c) >= reinterpret_cast<std::uintptr_t>(b) + 200);

    arena.pop(c);
    CHECK(tracker.current(MemoryCategory::activations) == 600);
    arena.pop(b);
    arena.pop(a);
    CHECK(arena.depth() == 0);
    CHECK(arena.live_bytes() == 0);
    CHECK(tracker.current(MemoryCategory::activations) == 0);
    CHECK(tracker.peak(MemoryCategory::activations) == 680);

    // A second step reuses the same storage.
    CHECK(arena.push<float>(100, "a") == a);
    arena.clear();
    CHECK(arena.depth() == 0);
}

TEST_CASE("ActivationArena refuses a pop that is not the most recent push", "[memory][arena]") {
    MemoryTracker tracker;
    snug::ActivationArena<snug::Host> arena(tracker, 4 * KiB);
    float* scores = arena.push<float>(64, "attn.scores");
    float* hidden = arena.push<float>(32, "mlp.hidden");

    std::string message = message_of<snug::Error>([&] { arena.pop(scores); });
    INFO(message);
    CHECK(message.find("attn.scores") != std::string::npos);
    CHECK(message.find("mlp.hidden") != std::string::npos);
    CHECK(arena.depth() == 2);
    CHECK(arena.live_bytes() == 384);  // 256 + 128
    CHECK(tracker.current(MemoryCategory::activations) == 384);

    int stranger = 0;
    CHECK(message_of<snug::Error>([&] { arena.pop(&stranger); }).find("not a live push") != std::string::npos);
    CHECK(arena.depth() == 2);

    arena.pop(hidden);
    arena.pop(scores);
    CHECK(message_of<snug::Error>([&] { arena.pop(scores); }).find("nothing is pushed") != std::string::npos);
    CHECK(tracker.current_total() == 0);
}

TEST_CASE("ActivationArena releases to a mark and catches a stale one", "[memory][arena]") {
    MemoryTracker tracker;
    snug::ActivationArena<snug::Host> arena(tracker, 4 * KiB);
    arena.push<std::uint8_t>(100, "block input");  // kept by a checkpointed block
    const auto m = arena.mark();
    std::uint8_t* y = arena.push<std::uint8_t>(300, "y");
    arena.push<std::uint8_t>(500, "z");
    CHECK(tracker.current(MemoryCategory::activations) == 900);

    arena.release_to(m);
    CHECK(arena.depth() == 1);
    CHECK(arena.live_bytes() == 100);
    CHECK(tracker.current(MemoryCategory::activations) == 100);
    arena.release_to(m);  // nothing above it: a no-op
    CHECK(arena.depth() == 1);

    // Recompute: the same pushes land in the same place.
    CHECK(arena.push<std::uint8_t>(300, "y") == y);
    const auto above = arena.mark();  // depth 2
    arena.push<std::uint8_t>(10, "w");
    arena.release_to(m);               // below `above`: now stale
    arena.push<std::uint8_t>(1, "u");
    arena.push<std::uint8_t>(2, "v");  // depth 3 again, but other pushes
    CHECK_THROWS_AS(arena.release_to(above), snug::Error);
    CHECK(arena.depth() == 3);
    CHECK(tracker.current(MemoryCategory::activations) == 103);

    arena.release_to(snug::ActivationArena<snug::Host>::Mark{});  // the bottom: pop everything
    CHECK(arena.depth() == 0);
    CHECK_THROWS_AS(arena.release_to(m), snug::Error);  // its push is gone
    CHECK(tracker.current_total() == 0);
}

TEST_CASE("the tracker's activation peak is the arena's high-water mark to the byte", "[memory][arena]") {
    MemoryTracker tracker;
    snug::ActivationArena<snug::Host> arena(tracker, 4 * KiB);
    //                                                         live bytes
    auto* p1 = arena.push<std::uint8_t>(1000, "p1");         // 1000
    auto* p2 = arena.push<std::uint8_t>(3000, "p2");         // 4000
    arena.pop(p2);                                           // 1000
    auto* p3 = arena.push<std::uint8_t>(2500, "p3");         // 3500
    auto* p4 = arena.push<std::uint8_t>(700, "p4");          // 4200 <- high-water
    // p1 at 0, p3 at 1024 (ends 3524); p4 would start at 3584 and end at
    // 4284 > 4096, so it opens a second chunk.
    CHECK(arena.chunk_count() == 2);
    for (auto* p : {p1, p3}) CHECK(aligned_to(p, 256));
    std::fill_n(p1, 1000, std::uint8_t{1});
    std::fill_n(p3, 2500, std::uint8_t{3});
    std::fill_n(p4, 700, std::uint8_t{4});
    CHECK(p1[999] == 1);
    CHECK(p3[0] == 3);
    CHECK(p3[2499] == 3);
    arena.pop(p4);                                           // 3500
    arena.pop(p3);                                           // 1000
    auto* p5 = arena.push<std::uint16_t>(50, "p5");          // 1100
    CHECK(arena.live_bytes() == 1100);
    CHECK(tracker.current(MemoryCategory::activations) == 1100);
    CHECK(tracker.peak(MemoryCategory::activations) == 4200);
    CHECK(tracker.peak_total() == 4200);
    arena.pop(p5);
    arena.pop(p1);
    CHECK(tracker.peak(MemoryCategory::activations) == 4200);
    CHECK(tracker.current_total() == 0);
}

TEST_CASE("arena pointers are 256-aligned and stay valid across chunks", "[memory][arena]") {
    CountingDevice::reset();
    MemoryTracker tracker;
    {
        snug::ActivationArena<CountingDevice> arena(tracker, 4 * KiB);
        // 375 uint32 = 1500 B, padded to a 1536 B stride: two fit a 4 KiB chunk
        // (0..1500, 1536..3036; a third would end at 3072 + 1500 > 4096).
        constexpr std::size_t pushes = 8;
        constexpr std::size_t count = 375;
        std::vector<std::uint32_t*> ptrs;
        for (std::size_t k = 0; k < pushes; ++k) {
            std::uint32_t* p = arena.push<std::uint32_t>(count, "layer");
            REQUIRE(aligned_to(p, 256));
            for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<std::uint32_t>(k * 1000003u + i);
            ptrs.push_back(p);
        }
        CHECK(arena.chunk_count() == 4);
        CHECK(CountingDevice::allocations == 4);
        CHECK(arena.reserved_bytes() == CountingDevice::bytes_requested);
        CHECK(arena.reserved_bytes() >= 4 * 4 * KiB);
        CHECK(arena.live_bytes() == pushes * 1500);
        CHECK(tracker.current(MemoryCategory::activations) == pushes * 1500);  // no padding counted
        for (std::size_t k = 0; k < pushes; ++k)
            for (std::size_t i = 0; i < count; ++i)
                REQUIRE(ptrs[k][i] == static_cast<std::uint32_t>(k * 1000003u + i));

        // Backward pops in reverse; the next step reuses every chunk.
        for (std::size_t k = pushes; k-- > 0;) arena.pop(ptrs[k]);
        for (std::size_t k = 0; k < pushes; ++k) CHECK(arena.push<std::uint32_t>(count, "layer") == ptrs[k]);
        CHECK(CountingDevice::allocations == 4);

        // A push larger than a chunk gets a chunk of its own.
        std::byte* big = arena.push<std::byte>(10000, "big");
        REQUIRE(aligned_to(big, 256));
        for (std::size_t i = 0; i < 10000; ++i) big[i] = std::byte{0x5a};
        CHECK(CountingDevice::allocations == 5);
        CHECK(CountingDevice::bytes_requested - arena.reserved_bytes() == 0);
        CHECK(ptrs[0][0] == 0u);
        CHECK(ptrs[7][374] == static_cast<std::uint32_t>(7 * 1000003u + 374));
        // Destroyed with pushes still live: the tracker is given them back.
    }
    require_all_zero(tracker);
    CHECK(CountingDevice::live == 0);
}

TEST_CASE("a zero-element push is a push", "[memory][arena]") {
    MemoryTracker tracker;
    snug::ActivationArena<snug::Host> arena(tracker, 4 * KiB);
    float* nothing = arena.push<float>(0, "empty before any chunk");
    CHECK(arena.depth() == 1);
    float* a = arena.push<float>(3, "a");
    float* empty = arena.push<float>(0, "empty");
    CHECK(arena.depth() == 3);
    CHECK(arena.live_bytes() == 12);
    arena.pop(empty);
    arena.pop(a);
    arena.pop(nothing);
    CHECK(arena.depth() == 0);
    CHECK(tracker.current_total() == 0);
}

TEST_CASE("arena error paths leave the arena and the tracker as they were", "[memory][arena]") {
    CountingDevice::reset();
    MemoryTracker tracker(1000);
    snug::ActivationArena<CountingDevice> arena(tracker, 512);
    auto* kept = arena.push<std::uint8_t>(600, "kept");  // a 768 B chunk (600 rounded up to 256s)
    CHECK(CountingDevice::allocations == 1);

    SECTION("over the budget") {
        std::string message = message_of<snug::OutOfMemory>([&] { arena.push<std::uint8_t>(500, "too much"); });
        CHECK(message.find("too much") != std::string::npos);
        CHECK(message.find("activations") != std::string::npos);
        CHECK(CountingDevice::allocations == 1);  // no chunk for a refused push
    }
    SECTION("the chunk allocation fails") {
        CountingDevice::fail = true;
        CHECK_THROWS_AS(arena.push<std::uint8_t>(300, "no chunk"), std::bad_alloc);
        CountingDevice::fail = false;
        CHECK(CountingDevice::allocations == 1);
    }
    SECTION("more elements than bytes can count") {
        CHECK_THROWS_AS(arena.push<double>(std::numeric_limits<std::size_t>::max() / 4, "huge"), snug::OutOfMemory);
    }
    CHECK(arena.depth() == 1);
    CHECK(arena.live_bytes() == 600);
    CHECK(tracker.current(MemoryCategory::activations) == 600);
    CHECK(tracker.current_total() == 600);
    // And it still works: 300 B more fit the budget (900 <= 1000) in a new chunk.
    auto* next = arena.push<std::uint8_t>(300, "next");
    CHECK(CountingDevice::allocations == 2);
    arena.pop(next);
    arena.pop(kept);
    CHECK(tracker.current_total() == 0);
}

TEST_CASE("an arena can be moved, pointers and records move with it", "[memory][arena]") {
    CountingDevice::reset();
    MemoryTracker tracker;
    {
        snug::ActivationArena<CountingDevice> first(tracker, 4 * KiB);
        int* p = first.push<int>(10, "x");
        p[9] = 42;
        snug::ActivationArena<CountingDevice> second(std::move(first));
        CHECK(second.depth() == 1);
        CHECK(first.depth() == 0);  // NOLINT(bugprone-use-after-move)
        CHECK(first.reserved_bytes() == 0);
        CHECK(p[9] == 42);
        CHECK(tracker.current(MemoryCategory::activations) == 40);

        snug::ActivationArena<CountingDevice> third(tracker, 4 * KiB);
        third.push<int>(5, "y");
        CHECK(tracker.current(MemoryCategory::activations) == 60);
        third = std::move(second);  // third's own push and chunk are given back
        CHECK(tracker.current(MemoryCategory::activations) == 40);
        CHECK(CountingDevice::live == 1);
        third.pop(p);
    }
    require_all_zero(tracker);
    CHECK(CountingDevice::live == 0);
}

TEST_CASE("an arena chunk size of zero is a configuration error", "[memory][arena]") {
    MemoryTracker tracker;
    CHECK_THROWS_AS(snug::ActivationArena<snug::Host>(tracker, 0), snug::ConfigError);
}

TEST_CASE("an arena can account its pushes under another category") {
    snug::MemoryTracker tracker;
    snug::ActivationArena<snug::Host> scratch(tracker, std::size_t{1} << 16, snug::MemoryCategory::temporaries);
    CHECK(scratch.category() == snug::MemoryCategory::temporaries);
    float* p = scratch.push<float>(100, "dqkv");
    CHECK(tracker.current(snug::MemoryCategory::temporaries) == 400);
    CHECK(tracker.current(snug::MemoryCategory::activations) == 0);
    scratch.pop(p);
    CHECK(tracker.current(snug::MemoryCategory::temporaries) == 0);
    CHECK(tracker.peak(snug::MemoryCategory::temporaries) == 400);
}
