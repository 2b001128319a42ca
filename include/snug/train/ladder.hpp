// The VRAM ladder: one model, one memory budget, the recommended order of
// operations walked rung by rung, each rung measured. Shared by
// examples/vram_ladder and `train_gpt --ladder`;
// a program fills LadderOptions and TrainOptions from its command line.
//
// Every rung trains the same model from the same weights on the same data
// with the same seed for the same number of tokens (the wanted batch of
// --batch sequences x --seq tokens per update, --steps updates):
//   1 fp32          the baseline: the wanted batch as one micro-batch
//   2 mixed         bf16 (fp16 + dynamic loss scaling with --ladder-precision fp16)
//   3 accumulation  only when rung 2 does not fit the budget: the largest
//                   micro-batch that fits (by the planner), accumulated up to the wanted batch
//   4 checkpoint    rung 3 (or 2) with activation checkpointing (--ladder-checkpoint)
//   4b              checkpointing with the largest micro-batch the freed memory allows
//                   (only when that is larger than rung 3's)
//   5 shorter context  the kept configuration at T / 2, accumulating twice as
//                   many micro-batches (same tokens per update)
// The checkpointing rule: it is kept when the configuration without it does
// not fit the budget, or when rung 4b (more sequences per micro-batch, fewer
// accumulation steps) is more than 5% faster than rung 3 (a smaller margin
// is within the run-to-run noise of a shared machine, and recomputation is
// not free); otherwise rung 5 builds on rung 3.
//
// Each rung reports its peak memory (total and by category, measured by the
// tracker, beside the planner's prediction), tokens/s, loss per unit of
// compute (the training loss at equal model FLOPs, and the mean loss over the
// first F FLOPs — the area under loss vs FLOPs divided by F — where F is the
// smallest total any rung reached), wall-clock, validation loss, and whether
// it fit. A rung is run without the budget whenever the machine can hold it,
// so that a rung over the budget is still measured (and marked "over budget");
// one the device cannot hold is reported with the planner's breakdown.
#pragma once

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snug/io/file.hpp"
#include "snug/train/data_source.hpp"
#include "snug/train/metrics.hpp"
#include "snug/train/model_source.hpp"
#include "snug/train/options.hpp"
#include "snug/train/planner.hpp"
#include "snug/train/report.hpp"
#include "snug/train/run.hpp"
#include "snug/train/run_plan.hpp"
#include "snug/train/run_spec.hpp"
#include "snug/train/session.hpp"

namespace snug {

// What the ladder is asked beyond the run's own options.
struct LadderOptions {
    std::string out;                     // ladder.csv, ladder.json (empty: the terminal table only)
    std::optional<PrecisionKind> mixed;  // rung 2's precision: bf16 or fp16 (nullopt: auto, bf16)
    CheckpointKind checkpoint = CheckpointKind::selective;  // rung 4's policy (full for blocks that cannot recompute selectively)
    // tools/plot_ladder.py, run with python3 after ladder.json is written
    // (empty: no plots; the examples set it to the source tree's copy).
    std::string plot_script;
};

namespace detail {

// 'text' for a POSIX shell, single quotes inside escaped.
inline std::string shell_quote(const std::string& text) {
    std::string out = "'";
    for (char ch : text) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return out + "'";
}

// Runs the plot script on dir/ladder.json: its exit code (3: no matplotlib)
// and the exact command, for the report to say where the plots are or how
// to make them.
inline LadderPlots plot_ladder(const std::string& script, const std::filesystem::path& dir) {
    const std::string command = "python3 " + shell_quote(script) + " " + shell_quote((dir / "ladder.json").string()) +
                                " --out " + shell_quote(dir.string());
    std::fflush(stdout);
    const int status = std::system((command + " > /dev/null 2>&1").c_str());
    const int code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return {code, dir.string(), command};
}

}  // namespace detail

// The planner's peak for a rung's configuration.
template <class Config>
MemoryPlan predict_rung(const TrainOptions& o, const Config& config, const PlanTarget& target) {
    return predict_memory(plan_input(o, config, target));
}

// Mean training loss over the first `flops` model FLOPs: the area under the
// (cumulative FLOPs, loss) curve, trapezoids, divided by `flops`.
inline std::optional<double> mean_loss_over_flops(const std::vector<StepRecord>& records, double flops) {
    if (records.empty() || flops <= 0.0) return std::nullopt;
    double area = 0.0, x0 = 0.0, y0 = records.front().train_loss;
    for (const StepRecord& r : records) {
        const double x1 = x0 + r.model_flops, y1 = r.train_loss;
        if (x1 >= flops) {
            const double t = (flops - x0) / (x1 - x0);
            area += (flops - x0) * (y0 + (y0 + t * (y1 - y0))) / 2.0;
            return area / flops;
        }
        area += (x1 - x0) * (y0 + y1) / 2.0;
        x0 = x1;
        y0 = y1;
    }
    return std::nullopt;  // the run did not reach `flops`
}

namespace detail {
// A rate rounded to a whole number, for the checkpointing rule's text.
inline std::string whole(double x) { return std::to_string(std::llround(x)); }

// {category: bytes, ..., "total": total} for ladder.json.
inline nlohmann::json bytes_json(const MemoryBreakdown& b, std::size_t total) {
    nlohmann::json j;
    for (MemoryCategory c : all_memory_categories)
        j[detail::json_key(category_name(c))] = b[static_cast<std::size_t>(c)];
    j["total"] = total;
    return j;
}
}  // namespace detail

// Runs the ladder and writes its table (terminal), ladder.csv and ladder.json.
template <class Dev, class Config = GPTConfig>
std::vector<LadderRung> run_ladder(const TrainOptions& base, const LadderOptions& lo, const DeviceInfo& device,
                                   const PlanTarget& target, std::optional<std::size_t> device_capacity,
                                   Report& report) {
    const int wanted = base.run.micro_batch;
    const int T = base.run.seq;
    const std::optional<std::size_t> budget = base.budget_bytes;
    const auto fits_budget = [&](std::size_t bytes) { return !budget || bytes <= *budget; };

    // Its files' directory first: rungs take minutes each on a GPU.
    io::make_directories(lo.out, "the ladder's output directory");
    // auto: bf16, which both backends compute (the host in software).
    const PrecisionKind mixed = lo.mixed.value_or(PrecisionKind::bf16);
    const RunInputsOf<Config> inputs = load_inputs<Config>(base, std::int64_t{wanted} * T * base.steps + 1);
    const TrainData& data = inputs.data;
    const ModelSourceOf<Config>& source = inputs.source;
    const Config& config = source.config;
    const ModelSummary summary = model_summary(config);

    std::vector<LadderRung> rungs;
    auto make = [&](std::string name, PrecisionKind precision, int B, int accum, int seq, CheckpointKind checkpoint) {
        LadderRung r;
        r.name = std::move(name);
        r.options = base;
        r.options.run = RunSpec{precision, checkpoint, B, seq, accum};
        r.options.out.clear();
        r.options.resume.clear();
        r.options.save_model.clear();
        r.options.export_hf.clear();
        r.options.sample = 0;
        r.predicted = predict_rung(r.options, config, target);
        return r;
    };
    // The largest micro-batch dividing `wanted` whose predicted peak fits (0: none).
    auto largest_fitting = [&](PrecisionKind precision, int seq, int per_update, CheckpointKind checkpoint) {
        for (int B = per_update; B >= 1; --B) {
            if (per_update % B != 0) continue;
            const LadderRung r = make("", precision, B, per_update / B, seq, checkpoint);
            if (fits_budget(r.predicted.required)) return B;
        }
        return 0;
    };
    Report silent;  // the rungs' own runs report nothing; the ladder reports each rung
    auto run = [&](LadderRung& r) {
        report.rung_started(r);
        if (device_capacity && r.predicted.required > *device_capacity) {
            r.ran = false;
            r.held = false;
            r.fits = false;
            r.note = "not run: the device cannot hold its predicted " + format_bytes(r.predicted.required) + " (" +
                     r.predicted.peak_moment + ")";
            report.rung_finished(r);
            return;
        }
        // Measured even when over the budget (the machine can hold it): the
        // tracker has no budget here, and the fit is judged from its peak.
        TrainOptions o = r.options;
        o.budget_bytes = std::nullopt;
        const TrainData rung_data =
            o.run.seq == T ? data : load_data(o, std::int64_t{wanted} * T * base.steps + 1, data.vocab);
        r.result = run_training<Dev>(o, rung_data, source, device, silent);
        r.ran = r.result.fit && r.result.exit_code == 0;
        r.fits = r.ran && fits_budget(r.result.peak_total);
        if (!r.result.fit) r.note = "out of memory:\n" + r.result.out_of_memory;
        if (r.ran && !r.fits) r.note = "over the budget by " + format_bytes(r.result.peak_total - *budget);
        report.rung_finished(r);
    };
    auto tokens_per_second = [](const LadderRung& r) { return r.result.summary.median_tokens_per_second.value_or(0.0); };
    constexpr double keep_margin = 1.05;  // checkpointing must buy more than 5% of tokens/s

    rungs.push_back(make("1 fp32 baseline", PrecisionKind::fp32, wanted, 1, T, CheckpointKind::none));
    run(rungs.back());
    rungs.push_back(make("2 mixed precision", mixed, wanted, 1, T, CheckpointKind::none));
    run(rungs.back());
    const LadderRung rung2 = rungs.back();

    // 3: accumulation, only when the wanted batch does not fit as one micro-batch.
    LadderRung base3 = rung2;
    if (!fits_budget(rung2.predicted.required)) {
        const int B = largest_fitting(mixed, T, wanted, CheckpointKind::none);
        const int B3 = std::max(B, 1);
        rungs.push_back(make("3 accumulation", mixed, B3, wanted / B3, T, CheckpointKind::none));
        if (B == 0) rungs.back().note = "no micro-batch fits without checkpointing; B = 1 shown";
        run(rungs.back());
        base3 = rungs.back();
    } else {
        LadderRung skipped = make("3 accumulation", mixed, wanted, 1, T, CheckpointKind::none);
        skipped.note = "not needed: the wanted batch fits as one micro-batch (rung 2)";
        skipped.needed = false;
        skipped.fits = rung2.fits;
        report.rung_not_needed(skipped);
        rungs.push_back(skipped);
    }

    // 4: checkpointing on rung 3's micro-batch; 4b: the larger micro-batch it
    // allows. Selective where the family's blocks recompute selectively,
    // full where they do not (a Llama's).
    const CheckpointKind rung4 = lo.checkpoint == CheckpointKind::selective && !config_recomputes_selectively<Config>()
                                     ? CheckpointKind::full
                                     : lo.checkpoint;
    rungs.push_back(make("4 checkpoint", mixed, base3.options.run.micro_batch, base3.options.run.accumulation, T, rung4));
    run(rungs.back());
    LadderRung kept = base3;
    const int B4 = largest_fitting(mixed, T, wanted, rung4);
    std::string rule;
    if (B4 > base3.options.run.micro_batch) {
        rungs.push_back(make("4b checkpoint, larger B", mixed, B4, wanted / B4, T, rung4));
        run(rungs.back());
        const LadderRung& r4b = rungs.back();
        if (!base3.fits || (r4b.ran && tokens_per_second(r4b) > keep_margin * tokens_per_second(base3))) {
            kept = r4b;
            rule = base3.fits ? "checkpointing kept: rung 4b runs " + detail::whole(tokens_per_second(r4b)) +
                                    " tokens/s against rung 3's " + detail::whole(tokens_per_second(base3))
                              : "checkpointing kept: without it nothing fits the budget";
        } else {
            rule = "checkpointing dropped: rung 4b runs " + detail::whole(tokens_per_second(r4b)) +
                   " tokens/s, not more than 5% faster than rung 3's " + detail::whole(tokens_per_second(base3));
        }
    } else if (!base3.fits) {
        kept = rungs[rungs.size() - 1];
        rule = "checkpointing kept: without it nothing fits the budget";
    } else {
        const LadderRung& r4 = rungs.back();
        const std::size_t before = base3.result.peak_total, after = r4.result.peak_total;
        rule = "checkpointing dropped: it frees " + (before > after ? format_bytes(before - after) : "nothing") +
               " but allows no larger micro-batch and costs " +
               detail::whole(100.0 * (1.0 - tokens_per_second(r4) / std::max(1.0, tokens_per_second(base3)))) +
               "% of tokens/s";
    }
    report.ladder_rule(rule);

    // 5: a shorter context, same tokens per update.
    if (T >= 2) {
        rungs.push_back(make("5 shorter context", kept.options.run.precision, kept.options.run.micro_batch, kept.options.run.accumulation * 2, T / 2,
                             kept.options.run.checkpoint));
        rungs.back().note = "continues from " + kept.name;
        run(rungs.back());
    }

    // 6 and 7: the kept configuration with another optimizer state.
    auto optimizer_rung = [&](std::string name, const RunSpec& spec) {
        LadderRung r = make(std::move(name), spec.precision, spec.micro_batch, spec.accumulation, T, spec.checkpoint);
        r.options.run = spec;
        r.predicted = predict_rung(r.options, config, target);
        r.note = "continues from " + kept.name;
        rungs.push_back(std::move(r));
        run(rungs.back());
    };
    // 6: lean optimizer state: 8-bit moments, and no fp32 master copy where
    // the weights are bf16 (optim/state_storage.hpp).
    optimizer_rung("6 lean optimizer state", kept.options.run.with_lean_optimizer());
    // 7: the optimizer offloaded to the host: the same arithmetic (the same
    // losses, bit for bit), no optimizer state or master weights on the
    // device; what it costs is time.
    optimizer_rung("7 optimizer offload", kept.options.run.with_offload());

    // Loss per unit of compute, at the smallest total any rung reached.
    double common = 0.0;
    for (const LadderRung& r : rungs)
        if (r.ran && r.result.summary.total_model_flops > 0.0)
            common = common == 0.0 ? r.result.summary.total_model_flops : std::min(common, r.result.summary.total_model_flops);
    for (LadderRung& r : rungs) {
        if (!r.ran) continue;
        r.loss_at_equal_flops = loss_at_flops(r.result.records, common);
        r.mean_loss_over_flops = mean_loss_over_flops(r.result.records, common);
    }

    report.ladder_table({summary, T, wanted, base.steps, budget, device.description, common, rule}, rungs);

    if (!lo.out.empty()) {
        nlohmann::json j;
        j["device"] = device.description;
        j["model"] = {{"arch", summary.family},       {"layers", summary.layers},
                      {"heads", summary.heads},       {"channels", summary.channels},
                      {"vocab", summary.vocab},       {"parameters", summary.parameters},
                      {"attention", attention_kind_name(summary.attention)}};
        j["budget_bytes"] = budget ? nlohmann::json(*budget) : nlohmann::json(nullptr);
        j["seq"] = T;
        j["sequences_per_update"] = wanted;
        j["updates"] = base.steps;
        j["flops_for_comparison"] = common;
        j["checkpoint_rule"] = rule;
        std::ostringstream csv;
        csv << "rung,precision,micro_batch,accumulation,seq,checkpoint,ran,fits,peak_bytes,predicted_peak_bytes";
        for (MemoryCategory c : all_memory_categories)
            csv << ",peak_" << detail::json_key(category_name(c));
        csv << ",tokens_per_second,loss_at_equal_flops,mean_loss_over_flops,val_loss,wall_clock_seconds,note\n";
        auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
        auto num = [](const std::optional<double>& v) { return v ? nlohmann::json(*v).dump() : std::string(); };
        for (const LadderRung& r : rungs) {
            nlohmann::json jr = {
                {"name", r.name},
                {"precision", r.options.run.precision_name()},
                {"micro_batch", r.options.run.micro_batch},
                {"accumulation", r.options.run.accumulation},
                {"seq", r.options.run.seq},
                {"checkpoint", r.options.run.checkpoint_name()},
                {"optimizer_state", std::string(moment_storage_name(r.options.run.moments))},
                {"master", std::string(master_storage_name(r.options.run.master))},
                {"offload", r.options.run.offload},
                {"host_peak_bytes", r.ran ? nlohmann::json(r.result.host_peak) : nlohmann::json(nullptr)},
                {"ran", r.ran},
                {"needed", r.needed},
                {"fits", r.fits},
                {"note", r.note},
                {"recompute_plan", r.result.recompute_plan},
                {"predicted_peak_bytes", detail::bytes_json(r.predicted.peak, r.predicted.total)},
                // What the device reserves as the planner counts it: arena chunks whole, the
                // device's allocation granularity and context (the host: exact allocations).
                {"predicted_reserved_bytes", r.predicted.reserved},
                // At the moment of the total's peak (sums to it), and each category's own peak.
                {"peak_bytes", r.ran ? detail::bytes_json(r.result.at_peak, r.result.peak_total) : nlohmann::json(nullptr)},
                {"category_peak_bytes", r.ran ? detail::bytes_json(r.result.peak_bytes, r.result.peak_total) : nlohmann::json(nullptr)},
                {"driver_peak_bytes", r.ran && r.result.driver_peak > 0 ? nlohmann::json(r.result.driver_peak)
                                                                          : nlohmann::json(nullptr)},
                {"tokens_per_second", r.ran ? opt(r.result.summary.median_tokens_per_second) : nlohmann::json(nullptr)},
                {"wall_clock_seconds", r.ran ? nlohmann::json(r.result.summary.wall_clock) : nlohmann::json(nullptr)},
                {"val_loss", r.ran ? opt(r.result.summary.final_val_loss) : nlohmann::json(nullptr)},
                {"loss_at_equal_flops", opt(r.loss_at_equal_flops)},
                {"loss_flops_auc", opt(r.mean_loss_over_flops)},
            };
            nlohmann::json curve = nlohmann::json::array();
            double flops = 0.0;
            for (const StepRecord& s : r.result.records) {
                flops += s.model_flops;
                curve.push_back({{"step", s.step}, {"flops", flops}, {"wall_clock", s.wall_clock},
                                 {"train_loss", s.train_loss}, {"val_loss", opt(s.val_loss)}});
            }
            jr["curve"] = curve;
            j["rungs"].push_back(jr);

            std::string note = r.note.substr(0, r.note.find('\n'));
            for (char& ch : note)
                if (ch == '"') ch = '\'';
            csv << '"' << r.name << "\"," << r.options.run.precision_name() << ',' << r.options.run.micro_batch << ',' << r.options.run.accumulation << ','
                << r.options.run.seq << ',' << r.options.run.checkpoint_name() << ',' << (r.ran ? 1 : 0) << ',' << (r.fits ? 1 : 0) << ','
                << (r.ran ? std::to_string(r.result.peak_total) : "") << ',' << r.predicted.total;
            for (MemoryCategory c : all_memory_categories)
                csv << ',' << (r.ran ? std::to_string(r.result.peak_bytes[static_cast<std::size_t>(c)]) : "");
            csv << ',' << (r.ran ? num(r.result.summary.median_tokens_per_second) : "") << ','
                << num(r.loss_at_equal_flops) << ',' << num(r.mean_loss_over_flops) << ','
                << (r.ran ? num(r.result.summary.final_val_loss) : "") << ','
                << (r.ran ? num(r.result.summary.wall_clock) : "") << ",\"" << note << "\"\n";
        }
        const std::string json_text = j.dump(1) + "\n", csv_text = csv.str();
        const std::filesystem::path dir(lo.out);
        io::atomic_write(dir / "ladder.json", [&](io::FileWriter& w) { w.write(json_text.data(), json_text.size()); });
        io::atomic_write(dir / "ladder.csv", [&](io::FileWriter& w) { w.write(csv_text.data(), csv_text.size()); });
        report.ladder_files(lo.out);
        if (!lo.plot_script.empty()) report.ladder_plots(detail::plot_ladder(lo.plot_script, dir));
    }
    return rungs;
}

// The ladder as a program's job: device, capacity, exit code (0 when every
// rung that ran trained without error).
template <class Config = GPTConfig>
int run_ladder_program(const TrainOptions& o, const LadderOptions& lo, const DeviceInfo& device, Report& report) {
    report.device(device);
    std::vector<LadderRung> rungs;
#if defined(SNUG_CUDA_BACKEND)
    if (device.cuda) {
        std::size_t free_bytes = 0, total_bytes = 0;
        cuda::check(cudaMemGetInfo(&free_bytes, &total_bytes));
        // The card's memory less a tenth; the plan counts the context itself.
        rungs = run_ladder<Cuda, Config>(o, lo, device, plan_target(device), total_bytes - total_bytes / 10, report);
    } else
#endif
        rungs = run_ladder<Host, Config>(o, lo, device, plan_target(device), std::nullopt, report);
    for (const LadderRung& r : rungs)
        if (r.result.exit_code != 0 && r.result.exit_code != 3) return 1;
    return 0;
}

}  // namespace snug
