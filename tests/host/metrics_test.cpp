// Metrics: the JSON line's fields and types, null for an unknown peak, the
// peak table, recompute FLOPs against a hand count, median, loss at equal
// FLOPs, the summary table, and the two display modes.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "snug/report/text_report.hpp"
#include "snug/train/metrics.hpp"

namespace {

snug::StepRecord sample_record() {
    snug::StepRecord r;
    r.step = 7;
    r.train_loss = 2.5;
    r.lr = 1e-3;
    r.grad_norm = 0.75;
    r.loss_scale = 65536.0;
    r.skipped = false;
    r.tokens = 4096;
    r.seconds = 0.5;
    r.model_flops = 1e12;
    r.hardware_flops = 1.5e12;
    r.peak_bytes[static_cast<std::size_t>(snug::MemoryCategory::parameters)] = 1000;
    r.peak_bytes[static_cast<std::size_t>(snug::MemoryCategory::activations)] = 5000;
    r.peak_total = 5500;
    r.wall_clock = 3.25;
    return r;
}

}  // namespace

TEST_CASE("metrics: a step's JSON line has every field with its type") {
    snug::StepRecord r = sample_record();
    r.peak_flops_per_second = 1e13;
    r.val_loss = 2.75;
    const nlohmann::json j = nlohmann::json::parse(snug::to_json(r).dump());
    CHECK(j.at("step").is_number_integer());
    CHECK(j.at("step").get<int>() == 7);
    CHECK(j.at("train_loss").get<double>() == 2.5);
    CHECK(j.at("lr").get<double>() == 1e-3);
    CHECK(j.at("grad_norm").get<double>() == 0.75);
    CHECK(j.at("loss_scale").get<double>() == 65536.0);
    CHECK(j.at("skipped").is_boolean());
    CHECK(j.at("skipped").get<bool>() == false);
    CHECK(j.at("tokens").get<long long>() == 4096);
    CHECK(j.at("tokens_per_second").get<double>() == Approx(8192.0));   // 4096 / 0.5
    CHECK(j.at("model_flops").get<double>() == 1e12);
    CHECK(j.at("hardware_flops").get<double>() == 1.5e12);
    CHECK(j.at("mfu").get<double>() == Approx(0.2));                   // 1e12 / 0.5 / 1e13
    CHECK(j.at("hfu").get<double>() == Approx(0.3));                   // 1.5e12 / 0.5 / 1e13
    CHECK_THAT(snug::progress_line(r, 100), Catch::Contains("MFU 20.0%"));  // a known peak: the column is there
    CHECK(j.at("wall_clock_seconds").get<double>() == 3.25);
    CHECK(j.at("val_loss").get<double>() == 2.75);
    const auto& peak = j.at("peak_bytes");
    CHECK(peak.at("parameters").get<long long>() == 1000);
    CHECK(peak.at("activations").get<long long>() == 5000);
    CHECK(peak.at("master_weights").get<long long>() == 0);
    CHECK(peak.at("optimizer_state").is_number_unsigned());
    CHECK(peak.at("total").get<long long>() == 5500);
    CHECK(peak.size() == snug::memory_category_count + 1);
}

TEST_CASE("metrics: an unknown peak gives null MFU and HFU, never a negative percentage") {
    snug::StepRecord r = sample_record();  // no peak_flops_per_second
    const nlohmann::json j = snug::to_json(r);
    CHECK(j.at("mfu").is_null());
    CHECK(j.at("hfu").is_null());
    CHECK(j.at("peak_flops_per_second").is_null());
    CHECK(j.at("val_loss").is_null());  // not an evaluation step
    const std::string line = snug::progress_line(r, 100);
    CHECK(line.find("MFU") == std::string::npos);  // the column is left out, not filled with "unknown"
    CHECK(line.find("unknown") == std::string::npos);
    CHECK(line.find('%') == std::string::npos);  // no "-100%" or any percentage
    CHECK(line.find("8192 tok/s") != std::string::npos);
    CHECK(snug::format_utilisation(std::nullopt) == "unknown peak");
}

TEST_CASE("metrics: the peak table knows datacenter GPUs and nothing else") {
    CHECK(snug::peak_flops("NVIDIA H100 80GB HBM3", "bf16").value() == 989.4e12);
    CHECK(snug::peak_flops("NVIDIA H200", "fp16").value() == 989.4e12);
    CHECK(snug::peak_flops("NVIDIA H200", "fp32").value() == 66.9e12);
    CHECK(snug::peak_flops("NVIDIA A100-SXM4-80GB", "bf16").value() == 312e12);
    CHECK(snug::peak_flops("NVIDIA A100-PCIE-40GB", "tf32").value() == 156e12);
    CHECK(snug::peak_flops("NVIDIA H100 PCIe", "bf16").value() == 756e12);
    CHECK_FALSE(snug::peak_flops("NVIDIA H100 NVL", "bf16"));
    CHECK_FALSE(snug::peak_flops("host", "fp32"));
    CHECK_FALSE(snug::peak_flops("NVIDIA GeForce RTX 3060", "bf16"));
    CHECK_FALSE(snug::peak_flops("NVIDIA H200", "int8"));
}

TEST_CASE("metrics: recompute FLOPs per token, counted by hand") {
    snug::GPTConfig c;
    c.n_layer = 3;
    c.channels = 8;
    c.n_head = 2;
    const int T = 16;
    // block parameters 12·64 + 13·8 = 872; one block forward 2·872 + 4·8·16 = 2256; attention 4·8·16 = 512
    const std::vector<snug::Recompute> none(3, snug::Recompute::none);
    const std::vector<snug::Recompute> mixed{snug::Recompute::full, snug::Recompute::selective, snug::Recompute::none};
    const std::vector<snug::Recompute> full(3, snug::Recompute::full);
    CHECK(snug::recompute_flops_per_token(c, T, none) == 0.0);
    CHECK(snug::recompute_flops_per_token(c, T, mixed) == 2256.0 + 512.0);
    CHECK(snug::recompute_flops_per_token(c, T, full) == 3 * 2256.0);
}

TEST_CASE("metrics: median of odd and even counts, none for empty") {
    CHECK(snug::median({5.0, 1.0, 3.0}).value() == 3.0);
    CHECK(snug::median({4.0, 1.0, 3.0, 10.0}).value() == 3.5);
    CHECK_FALSE(snug::median({}));
}

TEST_CASE("metrics: loss at equal FLOPs is read where cumulative model FLOPs reach the budget") {
    std::vector<snug::StepRecord> rs(4, sample_record());
    const double losses[] = {4.0, 3.0, 2.0, 1.0};
    for (int i = 0; i < 4; ++i) {
        rs[i].step = i + 1;
        rs[i].train_loss = losses[i];
        rs[i].model_flops = 10.0;
    }
    CHECK(snug::loss_at_flops(rs, 10.0).value() == 4.0);
    CHECK(snug::loss_at_flops(rs, 25.0).value() == 2.0);  // 10, 20, 30: the third
    CHECK(snug::loss_at_flops(rs, 40.0).value() == 1.0);
    CHECK_FALSE(snug::loss_at_flops(rs, 41.0));
}

TEST_CASE("metrics: the summary holds the run's numbers and renders them") {
    std::vector<snug::StepRecord> rs(3, sample_record());
    const double seconds[] = {1.0, 0.5, 0.25};  // 4096, 8192, 16384 tok/s
    for (int i = 0; i < 3; ++i) {
        rs[i].step = i + 1;
        rs[i].train_loss = 3.0 - i;
        rs[i].seconds = seconds[i];
        rs[i].model_flops = 2e9;
        rs[i].wall_clock = 1.0 + i;
    }
    rs[0].val_loss = 3.4567;
    rs[2].val_loss = 1.4321;
    rs[2].peak_total = 123456789;
    const snug::RunSummary s = snug::summarize(rs, std::nullopt, 1.2080);
    CHECK(s.steps == 3);
    CHECK(s.tokens == 3 * 4096);
    CHECK(s.median_tokens_per_second.value() == Approx(8192.0));
    CHECK(s.final_train_loss.value() == 1.0);
    CHECK(s.first_val_loss.value() == 3.4567);
    CHECK(s.final_val_loss.value() == 1.4321);
    CHECK(s.total_model_flops == 6e9);
    CHECK(s.flops_budget == 6e9);
    CHECK(s.loss_at_equal_flops.value() == 1.0);
    CHECK(s.wall_clock == 3.0);
    CHECK_FALSE(s.median_mfu);

    const std::string text = snug::render_summary(s);
    for (const char* expected : {"8192", "1.4321", "3.4567", "1.2080", "1.0000", "123456789", "117.74 MiB",
                                 "6.000e+09", "3.0 s", "12288 tokens"})
        CHECK_THAT(text, Catch::Contains(expected));
    // Without a known peak there is no MFU row at all.
    CHECK_THAT(text, !Catch::Contains("MFU") && !Catch::Contains("unknown"));

    const snug::RunSummary budgeted = snug::summarize(rs, 3e9);  // reached at the second update
    CHECK(budgeted.loss_at_equal_flops.value() == 2.0);
    CHECK_THAT(snug::render_summary(budgeted), Catch::Contains("2.0000 at 3.000e+09"));
    CHECK_THAT(snug::render_summary(snug::summarize(rs, 1e12)), Catch::Contains("n/a at 1.000e+12"));
}

TEST_CASE("metrics: plain display prints lines on the interval, live display rewrites one line") {
    const auto capture = [](bool live) {
        std::FILE* f = std::tmpfile();
        REQUIRE(f != nullptr);
        snug::ProgressDisplay d(f, live, 2);
        for (int step = 1; step <= 4; ++step) d.update(step, "line " + std::to_string(step));
        d.print("eval");
        d.finish();
        std::rewind(f);
        std::string text;
        for (int c; (c = std::fgetc(f)) != EOF;) text += static_cast<char>(c);
        std::fclose(f);
        return text;
    };
    CHECK(capture(false) == "line 1\nline 2\nline 4\neval\n");
    const std::string live = capture(true);
    CHECK(live.find('\r') != std::string::npos);
    CHECK(live.find("line 3") != std::string::npos);
    CHECK(live.find("eval\n") != std::string::npos);
}

TEST_CASE("metrics: the JSON lines file holds one parseable object per line") {
    const auto path = std::filesystem::temp_directory_path() / "snug_metrics_test.jsonl";
    {
        snug::JsonLinesFile file(path);
        snug::StepRecord r = sample_record();
        file.write(snug::to_json(r));
        r.step = 8;
        file.write(snug::to_json(r));
    }
    std::ifstream in(path);
    std::string line;
    std::vector<int> steps;
    while (std::getline(in, line)) steps.push_back(nlohmann::json::parse(line).at("step").get<int>());
    CHECK(steps == std::vector<int>{7, 8});
    std::filesystem::remove(path);
    CHECK_THROWS_AS(snug::JsonLinesFile("/nonexistent-dir/x.jsonl"), snug::FileError);
}
