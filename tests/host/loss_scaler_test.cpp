// The loss scalers' state machines against values written out by hand from
// PyTorch GradScaler's documented rules (initial scale 2^16; x2 after
// growth_interval clean steps in a row; x0.5 and the counter reset on an
// inf/NaN step), a step-by-step model written here for long random
// interleavings, the floor at the smallest normal float, the checkpoint round
// trip, knob validation, and the LossScaler concept.
#include "snug/precision/loss_scaler.hpp"

#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "snug/core/error.hpp"

namespace {

using Catch::Matchers::Contains;
using snug::DynamicLossScaler;
using snug::LossScalerState;
using snug::StaticLossScaler;

DynamicLossScaler with_interval(int interval) {
    DynamicLossScaler::Config c;
    c.growth_interval = interval;
    return DynamicLossScaler(c);
}

void steps(DynamicLossScaler& s, int n, bool found_inf) {
    for (int i = 0; i < n; ++i) s.update(found_inf);
}

// ---- concept checks ----

struct NoUpdate {
    float scale() const { return 1.0f; }
    float inv_scale() const { return 1.0f; }
    std::int64_t skipped_steps() const { return 0; }
    std::int64_t total_steps() const { return 0; }
    LossScalerState state() const { return {}; }
    void restore(const LossScalerState&) {}
};

struct UpdateTakesInt : NoUpdate {
    void update(int) {}
};

struct Complete : NoUpdate {
    void update(bool) {}
};

struct NoState {
    float scale() const { return 1.0f; }
    float inv_scale() const { return 1.0f; }
    void update(bool) {}
    std::int64_t skipped_steps() const { return 0; }
    std::int64_t total_steps() const { return 0; }
};

}  // namespace

TEST_CASE("LossScaler concept: the two scalers model it, incomplete types do not, per member", "[loss_scaler]") {
    STATIC_REQUIRE(snug::LossScaler<DynamicLossScaler>);
    STATIC_REQUIRE(snug::LossScaler<StaticLossScaler>);
    STATIC_REQUIRE(!snug::LossScaler<int>);
    STATIC_REQUIRE(!snug::LossScalerScale<int>);
    STATIC_REQUIRE(!snug::LossScaler<NoUpdate>);
    STATIC_REQUIRE(!snug::LossScalerUpdate<NoUpdate>);
    STATIC_REQUIRE(snug::LossScalerScale<NoUpdate>);
    STATIC_REQUIRE(snug::LossScalerCheckpoint<NoUpdate>);
    // update(int) accepts a bool argument too: it is still an update(found_inf).
    STATIC_REQUIRE(snug::LossScaler<UpdateTakesInt>);
    STATIC_REQUIRE(snug::LossScaler<Complete>);
    STATIC_REQUIRE(!snug::LossScaler<NoState>);
    STATIC_REQUIRE(!snug::LossScalerCheckpoint<NoState>);
    STATIC_REQUIRE(snug::LossScalerUpdate<NoState>);
    // update() must be callable on a non-const scaler; a const one cannot update.
    STATIC_REQUIRE(!snug::LossScalerUpdate<const DynamicLossScaler>);
}

TEST_CASE("DynamicLossScaler starts at 65536 with PyTorch's default knobs", "[loss_scaler]") {
    const DynamicLossScaler s;
    CHECK(s.scale() == 65536.0f);
    CHECK(s.inv_scale() == 1.0f / 65536.0f);
    CHECK(s.config().growth_factor == 2.0f);
    CHECK(s.config().backoff_factor == 0.5f);
    CHECK(s.config().growth_interval == 2000);
    CHECK(s.skipped_steps() == 0);
    CHECK(s.total_steps() == 0);
    CHECK(s.clean_steps_in_a_row() == 0);
}

TEST_CASE("DynamicLossScaler grows exactly after 2000 clean steps, not 1999", "[loss_scaler]") {
    DynamicLossScaler s;
    steps(s, 1999, false);
    CHECK(s.scale() == 65536.0f);
    CHECK(s.clean_steps_in_a_row() == 1999);
    s.update(false);
    CHECK(s.scale() == 131072.0f);
    CHECK(s.clean_steps_in_a_row() == 0);
    CHECK(s.total_steps() == 2000);
    CHECK(s.skipped_steps() == 0);
    // And again after another 2000.
    steps(s, 1999, false);
    CHECK(s.scale() == 131072.0f);
    s.update(false);
    CHECK(s.scale() == 262144.0f);
    CHECK(s.inv_scale() == 1.0f / 262144.0f);
}

TEST_CASE("DynamicLossScaler with growth_interval 3, step by step", "[loss_scaler]") {
    DynamicLossScaler s = with_interval(3);
    // {found_inf, scale after, tracker after}, written out from the rules.
    struct Step {
        bool inf;
        float scale;
        int tracker;
    };
    const Step expected[] = {
        {false, 65536.0f, 1},  {false, 65536.0f, 2},  {false, 131072.0f, 0},  // grow on the 3rd
        {false, 131072.0f, 1}, {true, 65536.0f, 0},                          // backoff resets the count
        {false, 65536.0f, 1},  {false, 65536.0f, 2},  {true, 32768.0f, 0},   // inf just before growth
        {true, 16384.0f, 0},   {false, 16384.0f, 1},  {false, 16384.0f, 2},
        {false, 32768.0f, 0},  {false, 32768.0f, 1},  {false, 32768.0f, 2},
        {false, 65536.0f, 0},
    };
    std::int64_t skipped = 0, total = 0;
    for (const Step& e : expected) {
        INFO("step " << total << (e.inf ? " (inf)" : " (clean)"));
        s.update(e.inf);
        ++total;
        skipped += e.inf ? 1 : 0;
        CHECK(s.scale() == e.scale);
        CHECK(s.clean_steps_in_a_row() == e.tracker);
        CHECK(s.skipped_steps() == skipped);
        CHECK(s.total_steps() == total);
    }
    CHECK(skipped == 3);
}

TEST_CASE("DynamicLossScaler: growth_interval 1 grows on every clean step", "[loss_scaler]") {
    DynamicLossScaler s = with_interval(1);
    s.update(false);
    CHECK(s.scale() == 131072.0f);
    s.update(false);
    CHECK(s.scale() == 262144.0f);
    s.update(true);
    CHECK(s.scale() == 131072.0f);
    CHECK(s.clean_steps_in_a_row() == 0);
}

TEST_CASE("DynamicLossScaler follows a hand model over random interleavings and custom knobs", "[loss_scaler]") {
    std::mt19937 gen(2024);
    struct Knobs {
        float init, growth, backoff;
        int interval;
        double p_overflow;  // chosen so that the walk stays far from the float range's ends
    };
    for (const Knobs k : {Knobs{65536.0f, 2.0f, 0.5f, 5, 0.13}, Knobs{1024.0f, 4.0f, 0.25f, 2, 0.32},
                          Knobs{3.0f, 1.5f, 0.75f, 7, 0.12}}) {
        INFO("init " << k.init << ", growth " << k.growth << ", backoff " << k.backoff << ", interval "
                     << k.interval);
        DynamicLossScaler::Config c;
        c.init_scale = k.init;
        c.growth_factor = k.growth;
        c.backoff_factor = k.backoff;
        c.growth_interval = k.interval;
        DynamicLossScaler s(c);
        // The model: the scale as a float product formed in double (exact,
        // then rounded once), clean steps since the last change.
        float scale = k.init;
        int run = 0;
        std::int64_t skipped = 0, grew = 0;
        std::bernoulli_distribution overflow(k.p_overflow);
        for (int i = 0; i < 1000; ++i) {
            const bool inf = overflow(gen);
            s.update(inf);
            if (inf) {
                scale = static_cast<float>(double(scale) * double(k.backoff));
                run = 0;
                ++skipped;
            } else if (++run == k.interval) {
                scale = static_cast<float>(double(scale) * double(k.growth));
                run = 0;
                ++grew;
            }
            // The guards at the ends of the range are tested on their own.
            REQUIRE(scale > 0x1p-120f);
            REQUIRE(scale < 0x1p120f);
            REQUIRE(s.scale() == scale);
            REQUIRE(s.clean_steps_in_a_row() == run);
            REQUIRE(s.skipped_steps() == skipped);
            REQUIRE(s.total_steps() == i + 1);
        }
        CHECK(skipped > 50);
        CHECK(grew > 20);
    }
}

TEST_CASE("DynamicLossScaler: backoff stops at the smallest normal float", "[loss_scaler]") {
    DynamicLossScaler s;
    // 2^16 halved 142 times reaches 2^-126, the smallest normal float.
    steps(s, 142, true);
    CHECK(s.scale() == 0x1p-126f);
    CHECK(s.scale() == std::numeric_limits<float>::min());
    // Further overflows keep it there (PyTorch would go subnormal, then 0).
    steps(s, 30, true);
    CHECK(s.scale() == 0x1p-126f);
    CHECK(s.inv_scale() == 0x1p126f);
    CHECK(s.skipped_steps() == 172);
    // It can still grow back.
    DynamicLossScaler::Config c;
    c.growth_interval = 2;
    c.init_scale = 0x1.8p-126f;  // 1.5 * 2^-126: one backoff would give a subnormal
    DynamicLossScaler t(c);
    t.update(true);
    CHECK(t.scale() == 0x1p-126f);
    t.update(false);
    t.update(false);
    CHECK(t.scale() == 0x1p-125f);
}

TEST_CASE("DynamicLossScaler: growth that would overflow to inf leaves the scale", "[loss_scaler]") {
    DynamicLossScaler::Config c;
    c.init_scale = 0x1p127f;
    c.growth_interval = 2;
    DynamicLossScaler s(c);
    steps(s, 2, false);
    CHECK(s.scale() == 0x1p127f);  // 2^128 is not a float
    CHECK(s.clean_steps_in_a_row() == 0);
    CHECK(s.inv_scale() == 0x1p-127f);
    s.update(true);
    CHECK(s.scale() == 0x1p126f);
}

TEST_CASE("DynamicLossScaler: state() and restore() round-trip mid-run", "[loss_scaler]") {
    DynamicLossScaler a = with_interval(3);
    const bool pattern[] = {false, false, false, true, false, true, true, false, false};
    for (const bool inf : pattern) a.update(inf);
    // By hand: grow on step 3 (131072), halve on 4, 6, 7 -> 16384; 2 clean since.
    const LossScalerState st = a.state();
    CHECK(st.scale == 16384.0f);
    CHECK(st.growth_tracker == 2);
    CHECK(st.skipped == 3);
    CHECK(st.steps == 9);

    DynamicLossScaler b = with_interval(3);
    b.restore(st);
    CHECK(b.scale() == a.scale());
    CHECK(b.clean_steps_in_a_row() == 2);
    CHECK(b.skipped_steps() == 3);
    CHECK(b.total_steps() == 9);
    // Both continue the same way: the restored one grows on its next clean step.
    a.update(false);
    b.update(false);
    CHECK(b.scale() == 32768.0f);
    CHECK(a.scale() == b.scale());
    CHECK(a.total_steps() == b.total_steps());
}

TEST_CASE("DynamicLossScaler: bad knobs and bad saved states throw ConfigError naming them", "[loss_scaler]") {
    const auto bad = [](auto edit) {
        DynamicLossScaler::Config c;
        edit(c);
        return c;
    };
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    using Config = DynamicLossScaler::Config;
    CHECK_THROWS_AS(DynamicLossScaler(bad([](Config& c) { c.init_scale = 0.0f; })), snug::ConfigError);
    CHECK_THROWS_WITH(DynamicLossScaler(bad([](Config& c) { c.init_scale = 0.0f; })),
                      Contains("init_scale") && Contains("= 0"));
    CHECK_THROWS_WITH(DynamicLossScaler(bad([](Config& c) { c.init_scale = -4.0f; })), Contains("init_scale"));
    CHECK_THROWS_WITH(DynamicLossScaler(bad([&](Config& c) { c.init_scale = inf; })), Contains("init_scale"));
    CHECK_THROWS_WITH(DynamicLossScaler(bad([&](Config& c) { c.init_scale = nan; })), Contains("init_scale"));
    CHECK_THROWS_WITH(DynamicLossScaler(bad([](Config& c) { c.init_scale = 1e-40f; })), Contains("init_scale"));
    CHECK_THROWS_WITH(DynamicLossScaler(bad([](Config& c) { c.growth_factor = 1.0f; })),
                      Contains("growth_factor") && Contains("= 1"));
    CHECK_THROWS_WITH(DynamicLossScaler(bad([](Config& c) { c.growth_factor = 0.5f; })), Contains("growth_factor"));
    CHECK_THROWS_WITH(DynamicLossScaler(bad([&](Config& c) { c.growth_factor = inf; })), Contains("growth_factor"));
    CHECK_THROWS_WITH(DynamicLossScaler(bad([](Config& c) { c.backoff_factor = 1.0f; })),
                      Contains("backoff_factor") && Contains("= 1"));
    CHECK_THROWS_WITH(DynamicLossScaler(bad([](Config& c) { c.backoff_factor = 0.0f; })),
                      Contains("backoff_factor"));
    CHECK_THROWS_WITH(DynamicLossScaler(bad([&](Config& c) { c.backoff_factor = nan; })),
                      Contains("backoff_factor"));
    CHECK_THROWS_WITH(DynamicLossScaler(bad([](Config& c) { c.growth_interval = 0; })),
                      Contains("growth_interval") && Contains("= 0"));
    CHECK_THROWS_WITH(DynamicLossScaler(bad([](Config& c) { c.growth_interval = -7; })),
                      Contains("growth_interval") && Contains("-7"));
    // Valid edges.
    CHECK_NOTHROW(DynamicLossScaler(bad([](Config& c) { c.growth_interval = 1; })));
    CHECK_NOTHROW(DynamicLossScaler(bad([](Config& c) { c.growth_factor = 1.0001f; })));
    CHECK_NOTHROW(DynamicLossScaler(bad([](Config& c) { c.init_scale = 0x1p-126f; })));

    DynamicLossScaler s = with_interval(3);
    s.update(false);
    const LossScalerState before = s.state();
    CHECK_THROWS_WITH(s.restore({0.0f, 0, 0, 0}), Contains("scale"));
    CHECK_THROWS_WITH(s.restore({nan, 0, 0, 0}), Contains("scale"));
    CHECK_THROWS_WITH(s.restore({1.0f, 3, 0, 10}), Contains("growth_tracker") && Contains("= 3"));
    CHECK_THROWS_WITH(s.restore({1.0f, -1, 0, 10}), Contains("growth_tracker"));
    CHECK_THROWS_WITH(s.restore({1.0f, 0, 0, -1}), Contains("steps"));
    CHECK_THROWS_WITH(s.restore({1.0f, 0, 11, 10}), Contains("skipped") && Contains("= 11"));
    CHECK_THROWS_AS(s.restore({1.0f, 0, -1, 10}), snug::ConfigError);
    // A refused restore changes nothing.
    const LossScalerState after = s.state();
    CHECK(after.scale == before.scale);
    CHECK(after.growth_tracker == before.growth_tracker);
    CHECK(after.skipped == before.skipped);
    CHECK(after.steps == before.steps);
}

TEST_CASE("StaticLossScaler never changes its scale and counts skipped steps", "[loss_scaler]") {
    StaticLossScaler d;
    CHECK(d.scale() == 65536.0f);
    // Value-initialised members of aggregates (as a precision policy holds them).
    struct Holder {
        StaticLossScaler s;
        DynamicLossScaler d;
    };
    const Holder h{};
    CHECK(h.s.scale() == 65536.0f);
    CHECK(h.d.scale() == 65536.0f);
    StaticLossScaler s(1024.0f);
    CHECK(s.scale() == 1024.0f);
    CHECK(s.inv_scale() == 1.0f / 1024.0f);
    std::mt19937 gen(5);
    std::bernoulli_distribution overflow(0.3);
    std::int64_t skipped = 0;
    for (int i = 0; i < 5000; ++i) {  // more clean steps in a row than any growth interval would need
        const bool inf = i >= 1000 && overflow(gen);
        s.update(inf);
        skipped += inf ? 1 : 0;
        REQUIRE(s.scale() == 1024.0f);
    }
    CHECK(s.skipped_steps() == skipped);
    CHECK(skipped > 1000);
    CHECK(s.total_steps() == 5000);
    // A scale that is not a power of two: 1/3 rounds once from double.
    CHECK(StaticLossScaler(3.0f).inv_scale() == static_cast<float>(1.0 / 3.0));

    const LossScalerState st = s.state();
    CHECK(st.scale == 1024.0f);
    CHECK(st.growth_tracker == 0);
    CHECK(st.skipped == skipped);
    CHECK(st.steps == 5000);
    StaticLossScaler r(1024.0f);
    r.restore(st);
    CHECK(r.skipped_steps() == skipped);
    CHECK(r.total_steps() == 5000);
    CHECK_THROWS_WITH(r.restore({2048.0f, 0, 0, 0}), Contains("scale") && Contains("2048"));
    CHECK_THROWS_WITH(r.restore({1024.0f, 5, 0, 0}), Contains("growth_tracker"));
    CHECK_THROWS_WITH(r.restore({1024.0f, 0, 6, 5}), Contains("skipped"));
    CHECK(r.total_steps() == 5000);

    CHECK_THROWS_AS(StaticLossScaler(0.0f), snug::ConfigError);
    CHECK_THROWS_WITH(StaticLossScaler(-1.0f), Contains("scale") && Contains("-1"));
    CHECK_THROWS_WITH(StaticLossScaler(std::numeric_limits<float>::infinity()), Contains("scale"));
}
