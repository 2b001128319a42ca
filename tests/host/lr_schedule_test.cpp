// LrSchedule: warmup and cosine values computed by hand, the floor, and
// rejection of nonsense settings.
#include <catch2/catch.hpp>

#include "snug/train/lr_schedule.hpp"

TEST_CASE("LrSchedule: linear warmup from zero reaches the peak at the last warmup step") {
    const snug::LrSchedule s{1.0f, 4, 12, 0.1f};
    CHECK(s(0) == Approx(0.25));
    CHECK(s(1) == Approx(0.50));
    CHECK(s(2) == Approx(0.75));
    CHECK(s(3) == Approx(1.00));
}

TEST_CASE("LrSchedule: cosine decay to the floor, values by hand") {
    // W = 4, S = 12: the decay spans 8 steps; floor 0.1.
    const snug::LrSchedule s{1.0f, 4, 12, 0.1f};
    CHECK(s(4) == Approx(1.0));                          // cos 0 = 1
    CHECK(s(6) == Approx(0.1 + 0.9 * 0.5 * (1 + 0.70710678118654752)));  // π/4
    CHECK(s(8) == Approx(0.55));                         // π/2: halfway between peak and floor
    CHECK(s(10) == Approx(0.1 + 0.9 * 0.5 * (1 - 0.70710678118654752))); // 3π/4
    CHECK(s(12) == Approx(0.1));                         // the end: the floor
    CHECK(s(1000) == Approx(0.1));                       // and it stays there
}

TEST_CASE("LrSchedule: the schedule never rises after warmup") {
    const snug::LrSchedule s{3e-3f, 10, 200, 0.0f};
    for (int i = 10; i < 210; ++i) CHECK(s(i + 1) <= s(i));
    CHECK(s(200) == 0.0f);
}

TEST_CASE("LrSchedule: without warmup the first update uses the peak") {
    const snug::LrSchedule s{2e-3f, 0, 100, 0.0f};
    CHECK(s(0) == Approx(2e-3));
    CHECK(s(50) == Approx(1e-3));
}

TEST_CASE("LrSchedule: nonsense settings are rejected by validate") {
    CHECK_THROWS_AS((snug::LrSchedule{0.0f, 0, 10, 0.0f}.validate()), snug::ConfigError);
    CHECK_THROWS_AS((snug::LrSchedule{1e-3f, -1, 10, 0.0f}.validate()), snug::ConfigError);
    CHECK_THROWS_AS((snug::LrSchedule{1e-3f, 0, 0, 0.0f}.validate()), snug::ConfigError);
    CHECK_THROWS_AS((snug::LrSchedule{1e-3f, 0, 10, 1.5f}.validate()), snug::ConfigError);
    CHECK_NOTHROW((snug::LrSchedule{1e-3f, 5, 10, 0.1f}.validate()));
}
