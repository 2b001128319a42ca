// TextReport: the events of a run as a log file shows them (not a terminal:
// plain lines, every twentieth update and the first), and the ladder's table
// with a rung that ran beside one the device could not hold.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "snug/report/text_report.hpp"

namespace {

// Runs `events` against a TextReport writing to a temporary file; its text.
template <class F>
std::string report_text(F&& events) {
    std::FILE* f = std::tmpfile();
    REQUIRE(f != nullptr);
    {
        snug::TextReport report(f, f);
        events(report);
    }
    std::rewind(f);
    std::string text;
    for (int c; (c = std::fgetc(f)) != EOF;) text += static_cast<char>(c);
    std::fclose(f);
    return text;
}

}  // namespace

TEST_CASE("text report: a run in a log prints the first and every twentieth update, evaluations and the summary") {
    const std::string text = report_text([](snug::Report& r) {
        r.evaluation(0, 3.25, 1.5);
        for (int step = 1; step <= 40; ++step) {
            snug::StepRecord rec;
            rec.step = step;
            rec.train_loss = 2.0;
            rec.tokens = 100;
            rec.seconds = 0.5;
            r.progress(rec, 40);
        }
        snug::RunSummary s;
        s.steps = 40;
        s.tokens = 4000;
        r.summary(s, 2);
        r.file_written("state", "out/state.snug");
    });
    CHECK_THAT(text, Catch::StartsWith("step 0: val loss 3.2500 nats (floor 1.5000)\n"));
    CHECK_THAT(text, Catch::Contains("step  1/40  loss 2.0000"));
    CHECK_THAT(text, Catch::Contains("step  2/40") && Catch::Contains("step 40/40"));
    CHECK_THAT(text, !Catch::Contains("step  3/40"));  // off the interval of 40 / 20 = 2
    CHECK_THAT(text, Catch::Contains("200 tok/s"));
    CHECK_THAT(text, !Catch::Contains("MFU"));         // no known peak: no column
    CHECK_THAT(text, Catch::Contains("  updates                 40 (4000 tokens)\n"));
    CHECK_THAT(text, Catch::Contains("  skipped updates         2 (non-finite gradients)\n"));
    CHECK_THAT(text, Catch::EndsWith("state: out/state.snug\n"));
}

TEST_CASE("text report: the ladder table shows measured and predicted MiB, and a rung the device cannot hold") {
    std::vector<snug::LadderRung> rungs(2);
    rungs[0].name = "1 fp32 baseline";
    rungs[0].options.run = snug::RunSpec{snug::PrecisionKind::fp32, snug::CheckpointKind::none, 8, 64, 1};
    rungs[0].ran = true;
    rungs[0].fits = true;
    rungs[0].result.peak_total = 3 * 1048576 + 524288;  // 3.5 MiB
    rungs[0].result.summary.median_tokens_per_second = 1234.4;
    rungs[0].result.summary.final_val_loss = 2.5;
    rungs[0].predicted.total = 3 * 1048576;
    rungs[1].name = "2 mixed precision";
    rungs[1].options.run = snug::RunSpec{snug::PrecisionKind::bf16, snug::CheckpointKind::none, 8, 64, 1};
    rungs[1].held = false;
    rungs[1].note = "not run: the device cannot hold it";
    snug::LadderTable t;
    t.seq = 64;
    t.budget = 4 * 1048576;
    t.device = "host";
    t.rule = "checkpointing dropped";
    const std::string table = snug::format_ladder_table(t, rungs);
    CHECK_THAT(table, Catch::Contains("budget 4.00 MiB; host\n"));
    CHECK_THAT(table, Catch::Contains("1 fp32 baseline          fp32       8x1    64 none              3.5        3.0 yes"));
    CHECK_THAT(table, Catch::Contains("1234"));
    CHECK_THAT(table, Catch::Contains("2 mixed precision        bf16       8x1    64 none                -        0.0 NO"));
    CHECK_THAT(table, Catch::Contains("  2 mixed precision: not run: the device cannot hold it\n"));
    CHECK_THAT(table, Catch::Contains("checkpointing dropped\n"));

    const std::string text = report_text([&](snug::Report& r) {
        r.rung_started(rungs[1]);
        r.rung_finished(rungs[1]);
    });
    CHECK_THAT(text, Catch::EndsWith("... not run (the device cannot hold it)\n"));
}
