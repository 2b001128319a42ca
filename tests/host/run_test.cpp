// The run loop as a library call, no command line: a few updates of a tiny
// model on the built-in corpus return what they measured and report each
// event in order; a budget too small for the model returns exit code 3 with
// the tracker's breakdown instead of throwing; a stop asked for after update
// K saves a state that resumes; the directories a run writes into are made
// (or refused, by name) before it trains.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "snug/report/text_report.hpp"
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
    o.budget_bytes = std::nullopt;
    return o;
}

// Each event the engine reports, as a short line: what happened, in order.
struct RecordingReport : snug::Report {
    std::vector<std::string> events;
    void activation_budget(std::optional<std::size_t>) override { events.push_back("activation budget"); }
    void resumed(const std::string&, std::int64_t step, double) override {
        events.push_back("resumed at " + std::to_string(step));
    }
    void recompute_plan(std::span<const snug::Recompute> plan) override {
        events.push_back("plan " + snug::describe_plan(plan));
    }
    void evaluation(std::int64_t step, double, std::optional<double> floor) override {
        events.push_back("eval " + std::to_string(step) + (floor ? " with floor" : ""));
    }
    void progress(const snug::StepRecord& r, std::int64_t total) override {
        events.push_back("step " + std::to_string(r.step) + "/" + std::to_string(total));
    }
    void stopped(std::int64_t step, bool signalled, const std::string& state) override {
        events.push_back("stopped " + std::to_string(step) + (signalled ? " signalled" : "") +
                         (state.empty() ? "" : " saved"));
    }
    void summary(const snug::RunSummary& s, std::int64_t skipped) override {
        events.push_back("summary " + std::to_string(s.steps) + " skipped " + std::to_string(skipped));
    }
    void file_written(std::string_view what, const std::string&) override { events.push_back(std::string(what)); }
    void sample(const snug::Sample& s) override { events.push_back("sample " + std::to_string(!s.text.empty())); }
};

snug::RunResult train_fp32(const snug::TrainOptions& o, snug::Report& report) {
    const snug::RunInputs in = snug::load_inputs(o, o.run.tokens_per_update() * o.steps + 1);
    const snug::DeviceInfo host = snug::choose_device("host");
    return snug::train<snug::Host, snug::precision::Fp32>(o, in.data, in.source, host, report);
}

snug::RunResult train_fp32(const snug::TrainOptions& o) {
    snug::Report silent;
    return train_fp32(o, silent);
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

TEST_CASE("run: the engine reports each event once, in the order it happens") {
    snug::test::TempDir dir;
    snug::TrainOptions o = tiny_options();
    o.out = dir.path.string();
    o.sample = 4;
    RecordingReport report;
    const snug::RunResult r = train_fp32(o, report);
    REQUIRE(r.exit_code == 0);
    const std::vector<std::string> expected{"eval 0 with floor", "plan none none", "step 1/3",  "step 2/3",
                                            "step 3/3",          "eval 3 with floor", "summary 3 skipped 0",
                                            "state",             "metrics",           "sample 1"};
    CHECK(report.events == expected);
    // The state file records the plan the run used (for a reader's information).
    std::ifstream state(o.state_path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(state)), std::istreambuf_iterator<char>());
    CHECK_THAT(bytes, Catch::Contains("\"recompute_plan\": \"none none\""));

    // Stopped after update 2 and resumed: the stop, then the resume, then only update 3.
    o.stop_after = 2;
    o.sample = 0;
    RecordingReport stopped;
    train_fp32(o, stopped);
    CHECK(stopped.events.back() == "stopped 2 saved");
    o.stop_after = 0;
    o.resume = o.state_path();
    RecordingReport resumed;
    train_fp32(o, resumed);
    REQUIRE(resumed.events.size() >= 3);
    CHECK(resumed.events[0] == "resumed at 2");
    CHECK(resumed.events[2] == "step 3/3");
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
    const std::filesystem::path after_two = dir.path / "after_two.snug";
    std::filesystem::copy_file(o.resume, after_two);
    const snug::RunResult rest = train_fp32(o);
    CHECK(rest.exit_code == 0);
    REQUIRE(rest.records.size() == 1);
    CHECK(rest.records.front().step == 3);
    // Another global batch is refused, naming both layouts...
    o.run.micro_batch = 4;
    CHECK_THROWS_WITH(train_fp32(o), Catch::Contains("the saved run took 2 sequences per update (1 rank x "
                                                     "micro-batch 2 x accumulation 1) but this one takes 4 (1 rank "
                                                     "x micro-batch 4 x accumulation 1)"));
    // ... but the same one laid out otherwise continues: micro-batch 1
    // accumulated twice reads the same rows; update 3 equals the straight
    // run's up to the order of the sums.
    o.run.micro_batch = 1;
    o.run.accumulation = 2;
    o.resume = after_two.string();
    const snug::RunResult relaid = train_fp32(o);
    CHECK(relaid.exit_code == 0);
    REQUIRE(relaid.records.size() == 1);
    CHECK(relaid.records.front().step == 3);
    snug::test::TempDir straight_dir;
    snug::TrainOptions straight = tiny_options();
    straight.out = straight_dir.path.string();
    const snug::RunResult whole = train_fp32(straight);
    REQUIRE(whole.records.size() == 3);
    CHECK(relaid.records.front().train_loss == Approx(whole.records.back().train_loss).epsilon(1e-5));
    CHECK(relaid.records.front().grad_norm == Approx(whole.records.back().grad_norm).epsilon(1e-5));
    CHECK(relaid.records.front().train_loss != Approx(whole.records.front().train_loss).epsilon(1e-3));
}

TEST_CASE("run: the directories it writes into are made before training, and what is in the way is named first") {
    const snug::test::TempDir dir;
    snug::TrainOptions o = tiny_options();
    o.steps = 1;
    o.eval_every = 1;
    o.out = (dir.path / "a" / "out").string();
    o.save_model = (dir.path / "b" / "c" / "model.bin").string();
    o.export_hf = (dir.path / "d" / "hf").string();
    const snug::RunResult r = train_fp32(o);
    CHECK(r.exit_code == 0);
    CHECK(std::filesystem::is_regular_file(dir.path / "a" / "out" / "state.snug"));
    CHECK(std::filesystem::is_regular_file(dir.path / "b" / "c" / "model.bin"));
    CHECK(std::filesystem::is_regular_file(dir.path / "d" / "hf" / "model.safetensors"));

    // A file where a directory should be, or --save-model naming a directory:
    // refused before the first update (no step reported), naming the option.
    std::ofstream(dir.path / "file") << "x";
    const auto refused = [&](snug::TrainOptions bad, const std::string& message) {
        RecordingReport report;
        CHECK_THROWS_WITH(train_fp32(bad, report), Catch::Matchers::Contains(message));
        CHECK(report.events.empty());
    };
    snug::TrainOptions bad = tiny_options();
    bad.export_hf = (dir.path / "file").string();
    refused(bad, "--export-hf " + bad.export_hf + ": cannot create the directory");
    bad = tiny_options();
    bad.out = (dir.path / "file" / "out").string();
    refused(bad, "--out " + bad.out + ": cannot create the directory");
    bad = tiny_options();
    bad.save_model = (dir.path / "file" / "model.bin").string();
    refused(bad, "--save-model's directory " + (dir.path / "file").string());
    bad = tiny_options();
    bad.save_model = (dir.path / "a").string();
    refused(bad, "--save-model " + bad.save_model + ": is a directory");
}

TEST_CASE("run: a run the host cannot hold is refused before its weights are made, naming both numbers") {
    const snug::TrainOptions o = tiny_options();
    const snug::DeviceInfo host = snug::choose_device("host");
    // What the run really holds: the tracker's peak (on the host backend the
    // device's memory is the host's) and the fp32 weights it starts from.
    const snug::RunResult r = train_fp32(o);
    REQUIRE(r.exit_code == 0);
    const snug::RunInputs in = snug::load_inputs(o, o.run.tokens_per_update() * o.steps + 1);
    const std::size_t weights = in.source.weights.size() * sizeof(float);
    const std::size_t need = r.peak_total + weights;
    auto room = [](std::size_t available) {
        snug::HostMemoryRoom m;
        m.available = available;
        return m;
    };
    CHECK_NOTHROW(snug::check_host_memory(o, in.source.config, host, room(need)));
    CHECK_THROWS_AS(snug::check_host_memory(o, in.source.config, host, room(need - 1)), snug::OutOfMemory);
    CHECK_THROWS_WITH(snug::check_host_memory(o, in.source.config, host, room(need - 1)),
                      Catch::StartsWith("out of host memory: this run needs " + snug::format_bytes(need) +
                                        " of host memory (the plan's peak of " + snug::format_bytes(r.peak_total) +
                                        " on the host backend + " + snug::format_bytes(weights) +
                                        " of fp32 initial weights) but this machine can give it " +
                                        snug::format_bytes(need - 1) + " (available memory " +
                                        snug::format_bytes(need - 1) + "); nothing was built.") &&
                          Catch::Contains("--batch") && Catch::Contains("--checkpoint full"));
    // Less room than the weights alone: refused before anything is planned.
    CHECK_THROWS_WITH(snug::check_host_memory(o, in.source.config, host, room(weights - 1)),
                      Catch::StartsWith("out of host memory: this run needs at least " + snug::format_bytes(weights) +
                                        " of host memory (its fp32 initial weights alone) but this machine can give "
                                        "it " + snug::format_bytes(weights - 1)));
    // The address-space limit counts what is mapped already; the smaller room decides.
    snug::HostMemoryRoom limited = room(std::size_t{1} << 40);
    limited.address_space_limit = std::size_t{3} << 30;
    limited.address_space_used = (std::size_t{3} << 30) - (need - 1);
    CHECK_THROWS_WITH(snug::check_host_memory(o, in.source.config, host, limited),
                      Catch::Contains("can give it " + snug::format_bytes(need - 1) +
                                      " (available memory 1.00 TiB, address-space limit 3.00 GiB (") &&
                          Catch::Contains("of it mapped already)"));
    limited.address_space_used -= 1;
    CHECK_NOTHROW(snug::check_host_memory(o, in.source.config, host, limited));
    // Nothing known: nothing to refuse.
    CHECK_NOTHROW(snug::check_host_memory(o, in.source.config, host, snug::HostMemoryRoom{}));
    // load_inputs asks before it makes a fresh model's weights: a refusal there leaves nothing made.
    bool asked = false;
    CHECK_THROWS_AS(snug::load_inputs(o, 1000,
                                      [&](const snug::GPTConfig& c) {
                                          asked = true;
                                          CHECK(c.num_parameters() == in.source.config.num_parameters());
                                          snug::check_host_memory(o, c, host, room(need - 1));
                                      }),
                    snug::OutOfMemory);
    CHECK(asked);
}

// ---- the same engine for a Llama (--arch llama) ------------------------------

namespace {

snug::TrainOptions llama_options() {
    snug::TrainOptions o = tiny_options();
    o.arch = snug::Arch::llama;
    o.layers = 2;
    o.heads = 4;
    o.channels = 16;
    o.run.precision = snug::PrecisionKind::bf16;
    o.run.accumulation = 2;
    o.run.checkpoint = snug::CheckpointKind::full;
    o.steps = 4;
    o.eval_every = 2;
    return o;
}

snug::RunResult train_llama(const snug::TrainOptions& o, snug::Report& report) {
    const snug::RunInputsOf<snug::LlamaConfig> in =
        snug::load_inputs<snug::LlamaConfig>(o, o.run.tokens_per_update() * o.steps + 1);
    return snug::run_training<snug::Host>(o, in.data, in.source, snug::choose_device("host"), report);
}

}  // namespace

TEST_CASE("run: a Llama trains through the same engine, and a stopped run resumes to the same losses, bit for bit") {
    snug::test::TempDir dir;
    snug::TrainOptions o = llama_options();
    o.out = (dir.path / "whole").string();
    snug::Report silent;
    const snug::RunResult whole = train_llama(o, silent);
    REQUIRE(whole.exit_code == 0);
    REQUIRE(whole.records.size() == 4);
    REQUIRE(whole.first_val_loss.has_value());
    CHECK(*whole.summary.final_val_loss < *whole.first_val_loss);
    CHECK(whole.recompute_plan == "full full");
    // Its model FLOPs are a Llama's (SwiGLU MLP of 64, untied head), not a
    // GPT's of the same width and depth.
    const snug::LlamaConfig config = snug::load_inputs<snug::LlamaConfig>(o, 1000).source.config;
    const double tokens = 2.0 * 2 * 16;  // accumulation x B x T
    const double llama_flops = snug::model_summary(config).flops_per_token(16) * tokens;
    CHECK(whole.records[0].model_flops == llama_flops);
    snug::GPTConfig gpt = snug::GPTConfig{}.with_vocab(config.vocab_size).with_context(16);
    gpt.n_layer = 2;
    gpt.n_head = 4;
    gpt.channels = 16;
    CHECK(whole.records[0].model_flops != snug::model_summary(gpt).flops_per_token(16) * tokens);

    // Stopped after update 2, resumed in a new run: the last two updates' losses are the same bits.
    o.out = (dir.path / "parts").string();
    o.stop_after = 2;
    train_llama(o, silent);
    o.stop_after = 0;
    o.resume = o.state_path();
    RecordingReport resumed;
    const snug::RunResult rest = train_llama(o, resumed);
    REQUIRE(rest.records.size() == 2);
    CHECK(resumed.events.front() == "resumed at 2");
    for (std::size_t i = 0; i < 2; ++i) {
        INFO("update " << rest.records[i].step);
        CHECK(rest.records[i].train_loss == whole.records[i + 2].train_loss);
        CHECK(rest.records[i].grad_norm == whole.records[i + 2].grad_norm);
    }
}

TEST_CASE("run: a Llama state is refused by a Llama of another head count, and by a GPT, each by name") {
    snug::test::TempDir dir;
    snug::TrainOptions o = llama_options();
    o.out = dir.path.string();
    o.steps = 1;
    snug::Report silent;
    REQUIRE(train_llama(o, silent).exit_code == 0);
    // As many parameters with 2 heads: the state file's model identity refuses it.
    snug::TrainOptions other = o;
    other.heads = 2;
    other.steps = 2;
    other.resume = o.state_path();
    other.out = (dir.path / "other").string();
    CHECK_THROWS_WITH(train_llama(other, silent), Catch::Contains("heads") && Catch::Contains("4") &&
                                                      Catch::Contains("2"));
    // A GPT of any shape: the family differs.
    snug::TrainOptions gpt = tiny_options();
    gpt.steps = 2;
    gpt.resume = o.state_path();
    gpt.out = (dir.path / "gpt").string();
    CHECK_THROWS_AS(train_fp32(gpt), snug::Error);
}

TEST_CASE("run: a grouped-query Llama (--kv-heads 2) trains, reports its key/value heads, and its state keeps them") {
    snug::test::TempDir dir;
    snug::TrainOptions o = llama_options();
    o.kv_heads = 2;
    o.out = dir.path.string();
    RecordingReport report;
    const snug::RunResult r = train_llama(o, report);
    REQUIRE(r.exit_code == 0);
    REQUIRE(r.first_val_loss.has_value());
    CHECK(*r.summary.final_val_loss < *r.first_val_loss);
    const snug::LlamaConfig config = snug::load_inputs<snug::LlamaConfig>(o, 1000).source.config;
    CHECK(config.block.key_value_heads() == 2);
    CHECK(snug::format_model_shape(snug::model_summary(config)) ==
          "llama, 2 layers, 4 heads (2 key/value), 16 channels");
    // Fewer parameters than the multi-head Llama: k and v hold 2 heads of 4, not 4.
    snug::TrainOptions mha = o;
    mha.kv_heads = 0;
    const snug::LlamaConfig full = snug::load_inputs<snug::LlamaConfig>(mha, 1000).source.config;
    CHECK(snug::model_summary(full).parameters - snug::model_summary(config).parameters == 2 * (2 * 2 * 4 * 16));
    // Its state resumes only into the same grouping, refused by name otherwise.
    mha.steps = 2;
    mha.resume = o.state_path();
    mha.out = (dir.path / "mha").string();
    snug::Report silent;
    CHECK_THROWS_WITH(train_llama(mha, silent), Catch::Contains("kv_heads"));
    // --kv-heads is the Llama's: a GPT refuses it by name.
    snug::TrainOptions gpt = tiny_options();
    gpt.kv_heads = 2;
    CHECK_THROWS_WITH(gpt.shape<snug::GPTConfig>(), Catch::Contains("--kv-heads 2"));
}

TEST_CASE("run: a Llama run refuses llm.c files by flag before reading anything, and takes Hugging Face ones") {
    snug::TrainOptions o = llama_options();
    o.init_from = "/nonexistent/llama";  // read as a Hugging Face Llama directory (io/hf_llama.hpp)
    CHECK_THROWS_WITH(snug::load_inputs<snug::LlamaConfig>(o, 1000),
                      Catch::Contains("/nonexistent/llama/config.json: cannot open"));
    o.init_from.clear();
    o.save_model = "/tmp/x.bin";
    CHECK_THROWS_WITH(snug::check_model_files<snug::LlamaConfig>(o),
                      Catch::Contains("--save-model /tmp/x.bin: llm.c files hold a GPT-2"));
    CHECK_NOTHROW(snug::check_model_files<snug::GPTConfig>(o));
    o.save_model.clear();
    o.export_hf = "/tmp/x";  // a Hugging Face Llama directory (io/hf_llama.hpp)
    CHECK_NOTHROW(snug::check_model_files<snug::LlamaConfig>(o));
}

TEST_CASE("run: --checkpoint selective for a Llama is refused by name, its blocks cannot recompute selectively") {
    snug::TrainOptions o = llama_options();
    o.run.checkpoint = snug::CheckpointKind::selective;
    snug::Report silent;
    CHECK_THROWS_WITH(train_llama(o, silent), Catch::Contains("--checkpoint selective") &&
                                                  Catch::Contains("llama") && Catch::Contains("full, every:K or auto"));
}
