// snug::Meter, the metering device: its addresses (distinct, aligned, never
// memory), the ledger of what a device would reserve, and the tracker and
// arena bookkeeping that must be the same as on a real device.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include "snug/core/arena.hpp"
#include "snug/core/buffer.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/meter/device.hpp"
#include "snug/ops/kernels.hpp"

using snug::Meter;
using snug::MemoryCategory;

TEST_CASE("meter addresses are distinct, 256-byte aligned, never null, never reused") {
    std::set<std::uintptr_t> seen;
    std::uintptr_t previous_end = 0;
    for (std::size_t bytes : {std::size_t{1}, std::size_t{255}, std::size_t{256}, std::size_t{257},
                              std::size_t{3} << 30, std::size_t{7}}) {
        void* p = Meter::allocate(bytes);
        const auto a = reinterpret_cast<std::uintptr_t>(p);
        CHECK(p != nullptr);
        CHECK(a % 256 == 0);
        CHECK(a >= previous_end);  // no overlap with the one before, even after it is freed
        CHECK(seen.insert(a).second);
        previous_end = a + bytes;
        Meter::deallocate(p);
    }
    CHECK(Meter::allocate(0) == nullptr);
}

TEST_CASE("the ledger counts live and peak bytes at its granularity, ledgers nest") {
    snug::meter::Ledger exact;
    void* a = Meter::allocate(1000);
    void* b = Meter::allocate(24);
    CHECK(exact.live_bytes() == 1024);
    {
        snug::meter::Ledger pages(std::size_t{2} << 20);
        void* c = Meter::allocate(1);
        void* d = Meter::allocate((std::size_t{2} << 20) + 1);
        CHECK(pages.live_bytes() == (std::size_t{6} << 20));  // one page, then two
        Meter::deallocate(c);
        CHECK(pages.live_bytes() == (std::size_t{4} << 20));
        CHECK(pages.peak_bytes() == (std::size_t{6} << 20));
        Meter::deallocate(d);
        Meter::deallocate(a);  // opened before this ledger: not its business
        CHECK(pages.live_bytes() == 0);
        CHECK(pages.allocations() == 2);
    }
    // The outer ledger counts again, and never saw c and d.
    CHECK(exact.live_bytes() == 1024);
    Meter::deallocate(b);
    CHECK(exact.live_bytes() == 1000);
    CHECK(exact.peak_bytes() == 1024);
}

TEST_CASE("on Meter, buffers and arenas record the tracker exactly as on a device, arena chunks in the ledger") {
    snug::meter::Ledger ledger;
    snug::MemoryTracker tracker(std::size_t{1} << 40);  // 1 TiB: nothing of it is real
    {
        snug::Buffer<float, Meter> weights(tracker, MemoryCategory::parameters, std::size_t{100} << 30, "weights");
        CHECK(tracker.current(MemoryCategory::parameters) == (std::size_t{400} << 30));
        snug::ActivationArena<Meter> arena(tracker);
        float* x = arena.push<float>(10, "x");     // first chunk: 64 MiB
        float* y = arena.push<float>(std::size_t{20} << 20, "y");  // 80 MiB: a chunk of its own
        CHECK(reinterpret_cast<std::uintptr_t>(x) % 256 == 0);
        CHECK(tracker.current(MemoryCategory::activations) == 40 + (std::size_t{80} << 20));
        CHECK(arena.chunk_count() == 2);
        CHECK(arena.reserved_bytes() == (std::size_t{64} << 20) + (std::size_t{80} << 20));
        CHECK(ledger.live_bytes() == (std::size_t{400} << 30) + arena.reserved_bytes());
        // The kernels do nothing: a download leaves the host value as it was.
        float host = 42.0f;
        download(Meter{}, &host, y, 1);
        fill_zero(Meter{}, y, 1);
        CHECK(host == 42.0f);
        arena.pop(y);
        arena.pop(x);
        CHECK(tracker.current(MemoryCategory::activations) == 0);
    }
    CHECK(tracker.current_total() == 0);
    CHECK(ledger.live_bytes() == 0);
    CHECK(tracker.peak_allocation() == "y");
    // Over the tracker's budget: refused before any address is handed out.
    const std::size_t before = ledger.allocations();
    CHECK_THROWS_AS((snug::Buffer<float, Meter>(tracker, MemoryCategory::parameters, std::size_t{1} << 40, "too big")),
                    snug::OutOfMemory);
    CHECK(ledger.allocations() == before);
}

TEST_CASE("the meter's kernels check the shared contracts, so a plan refuses what training refuses") {
    float* p = reinterpret_cast<float*>(std::uintptr_t{1} << 20);  // never read
    CHECK_THROWS_AS(layernorm_forward(Meter{}, p, p, p, p, p, p, 4, 0), snug::ShapeError);
    CHECK_THROWS_AS(attention_forward(Meter{}, p, p, p, 1, 8, 30, 4), snug::ShapeError);  // C not a multiple of NH
    CHECK_THROWS_AS(softmax_cross_entropy(Meter{}, p, p, nullptr, 4, 65, 64, 1.0f), snug::ShapeError);  // V > Vp
    CHECK_THROWS_AS(linear_forward(Meter{}, p, static_cast<const float*>(nullptr), p, p, 2, 3, 4), snug::Error);
    CHECK_THROWS_AS(adamw_update(Meter{}, p, p, p, p, p, 8, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0, 1.0f),
                    snug::ConfigError);
    CHECK_NOTHROW(attention_forward(Meter{}, p, p, p, 1, 8, 32, 4));
}

TEST_CASE("the meter's Llama kernels (RMSNorm, SwiGLU, RoPE) check the shared contracts") {
    float* p = reinterpret_cast<float*>(std::uintptr_t{1} << 20);  // never read
    CHECK_THROWS_WITH(rmsnorm_forward(Meter{}, p, p, p, p, 4, 0), Catch::Contains("rmsnorm_forward") &&
                                                                      Catch::Contains("C = 0"));
    CHECK_THROWS_AS(rmsnorm_forward(Meter{}, p, p, p, p, 4, 8, -1e-5), snug::ConfigError);
    CHECK_THROWS_AS(rmsnorm_backward(Meter{}, p, p, p, p, p, p, -4, 8), snug::ShapeError);
    CHECK_THROWS_AS(swiglu_forward(Meter{}, p, p, 4, -1), snug::ShapeError);
    CHECK_THROWS_AS(swiglu_backward(Meter{}, p, p, p, -4, 1), snug::ShapeError);
    CHECK_THROWS_WITH(rope_forward(Meter{}, p, p, 2, 8, 4, 15), Catch::Contains("rope_forward") &&
                                                                    Catch::Contains("hs = 15 is odd"));
    CHECK_THROWS_AS(rope_backward(Meter{}, p, p, 2, 8, 4, 16, 10000.0, -3), snug::ConfigError);
    CHECK_NOTHROW(rmsnorm_forward(Meter{}, p, p, p, p, 4, 8));
    CHECK_NOTHROW(rmsnorm_backward(Meter{}, p, p, p, p, p, p, 4, 8));
    CHECK_NOTHROW(swiglu_forward(Meter{}, p, p, 4, 8));
    CHECK_NOTHROW(swiglu_backward(Meter{}, p, p, p, 4, 8));
    CHECK_NOTHROW(rope_forward(Meter{}, p, p, 2, 8, 4, 16));
    CHECK_NOTHROW(rope_backward(Meter{}, p, p, 2, 8, 4, 16, 500000.0, 7));
}
