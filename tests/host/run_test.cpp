// The run loop as a library call, no command line: a few updates of a tiny
// model on the built-in corpus return what they measured; a budget too small
// for the model returns exit code 3 with the tracker's breakdown instead of
// throwing; a stop asked for after update K saves a state that resumes.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "snug/train/run.hpp"
#include "support/temp_dir.hpp"

namespace {

snug::TrainOptions tiny_options() {
    snug::TrainOptions o;
    o.layers = 2;
    o.heads = 2;
    o.channels = 16;
    o.run = snug::RunSpec{snug::PrecisionKind::fp32, snug::CheckpointKind::none, /*micro_batch=*/2, /*seq=*/16,
                          /*accumulation=*/1};
    o.steps = 3;
    o.warmup = 1;
    o.eval_every = 3;
    o.eval_batches = 1;
    o.sample = 0;
    o.quiet = true;  // nothing printed but what a test asks for
    o.budget_bytes = std::nullopt;
    return o;
}

snug::RunResult train_fp32(const snug::TrainOptions& o) {
    const snug::RunInputs in = snug::load_inputs(o, o.run.tokens_per_update() * o.steps + 1);
    const snug::DeviceInfo host = snug::choose_device("host");
    return snug::train<snug::Host, snug::precision::Fp32, snug::checkpoint::None>(o, in.data, in.source, host, nullptr);
}

}  // namespace

TEST_CASE("run: a few updates return their records, losses and peak memory") {
    const snug::RunResult r = train_fp32(tiny_options());
    CHECK(r.exit_code == 0);
    CHECK(r.fit);
    REQUIRE(r.records.size() == 3);
    CHECK(r.records.back().step == 3);
    CHECK(r.first_val_loss.has_value());
    REQUIRE(r.summary.final_val_loss.has_value());
    CHECK(*r.summary.final_val_loss < *r.first_val_loss);  // three updates at lr 3e-3 already learn the unigrams
    CHECK(r.peak_total > 0);
    CHECK(r.recompute_plan == "none none");
}

TEST_CASE("run: over the memory budget the run returns exit code 3 and the tracker's breakdown") {
    snug::TrainOptions o = tiny_options();
    o.budget_bytes = 1024;  // less than the parameters alone
    const snug::RunResult r = train_fp32(o);
    CHECK_FALSE(r.fit);
    CHECK(r.exit_code == 3);
    CHECK_THAT(r.out_of_memory, Catch::Contains("parameters") && Catch::Contains("budget"));
    CHECK(r.records.empty());
}

TEST_CASE("run: a stop after update K saves the state, and a resumed run continues from K") {
    snug::test::TempDir dir;
    snug::TrainOptions o = tiny_options();
    o.out = dir.path.string();
    o.stop_after = 2;
    const snug::RunResult first = train_fp32(o);
    CHECK(first.exit_code == 0);
    CHECK(first.interrupted);
    CHECK(first.records.size() == 2);
    o.stop_after = 0;
    o.resume = o.state_path();
    const snug::RunResult rest = train_fp32(o);
    CHECK(rest.exit_code == 0);
    REQUIRE(rest.records.size() == 1);
    CHECK(rest.records.front().step == 3);
    // A resume under another micro-batch is refused, naming it.
    o.run.micro_batch = 4;
    CHECK_THROWS_WITH(train_fp32(o), Catch::Contains("batch was 2 in the saved run but is 4 now"));
}
