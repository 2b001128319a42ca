// The run loop: one training run of a model of any family the engine builds
// (GPT-2, Llama: train/arch.hpp; the model is model_of<Config, Act, Dev>), top
// to bottom, that returns what it measured instead of exiting (a program
// prints it, the VRAM ladder compares runs) and tells a Report (report.hpp)
// each event as it happens.
//
// train<Dev, Precision, Config>(options, data, model source, device, report, tokenizer, ranks, communicator):
//   the output directories made first (prepare_output_directories), the
//   session (the budget), the model, the token buffers, TrainStep;
//   data parallel over `ranks` (dist/ranks.hpp): each rank trains on its rows of
//   every global batch, TrainStep sums gradients and loss over the ranks, rank 0
//   alone reports and writes files (the others' weights are checked equal at
//   each save); one rank is the single process;
//   resume: the saved state replaces weights, optimizer, scaler, data position;
//   each update: LR from the schedule, n micro-batches, TrainStep::step, a record
//   (JSON line + report.progress), validation at the interval, the state saved every
//   save_every updates and when a stop is asked for (Ctrl-C, stop_after);
//   the end: the summary, the state and model files asked for, a sample.
// run_training<Dev>(...) picks the precision type from options.run (the
// family from the model source's config type);
// run_evaluation<Dev>(...) only evaluates a model (--eval-only).
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/accumulate/policies.hpp"
#include "snug/checkpoint/policies.hpp"
#include "snug/core/memory.hpp"
#include "snug/data/loader.hpp"
#include "snug/data/tokenizer.hpp"
#include "snug/dist/communicator.hpp"
#include "snug/dist/ranks.hpp"
#include "snug/dist/sharded_state.hpp"
#include "snug/io/file.hpp"
#include "snug/io/hf_export.hpp"
#include "snug/io/hf_llama.hpp"
#include "snug/io/llmc_model.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/train/data_source.hpp"
#include "snug/train/host_allocation.hpp"
#include "snug/train/lr_schedule.hpp"
#include "snug/train/metrics.hpp"
#include "snug/train/model_source.hpp"
#include "snug/train/options.hpp"
#include "snug/train/report.hpp"
#include "snug/train/run_plan.hpp"
#include "snug/train/run_spec.hpp"
#include "snug/train/sampling.hpp"
#include "snug/train/session.hpp"
#include "snug/train/state_file.hpp"
#include "snug/train/train_step.hpp"

namespace snug {

// ---- Ctrl-C --------------------------------------------------------------------

// Set by SIGINT/SIGTERM once a program calls install_stop_handler (the
// library installs none by itself); the loop finishes the update in flight,
// saves the state and stops. A second Ctrl-C kills as usual.
inline std::atomic<bool> stop_requested{false};

extern "C" inline void on_stop_signal(int) {
    stop_requested.store(true);
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
}

inline void install_stop_handler() {
    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
}

// ---- what a run is, for the state file -----------------------------------------------

// The options a resumed run must share with the run that saved the state.
// The global batch — sequences per update, `ranks` data-parallel ranks each
// accumulating `accum` micro-batches of `batch` — must stay the same, but not
// its layout: every layout reads the same rows for an update (consecutive
// windows of the stream, data/loader.hpp; only at the end of the data does
// a wider window wrap around sooner), so a run may continue on fewer or
// more ranks (a ZeRO-1 state is saved whole and loads as any rank's shard)
// or with a smaller micro-batch accumulated more often, computing the same
// updates up to the order of the sums.
// The rest may change on resume: steps, schedule, evaluation, files, and the
// checkpoint policy (recomputation gives the same gradients bit for bit, so
// a run may move to a smaller card with --checkpoint auto and continue).
// The optimizer's settings are checked by load_training_state itself.
template <class Config>
nlohmann::json run_identity(const TrainOptions& o, const Config& config, int ranks = 1) {
    const ModelSummary c = model_summary(config);
    return {{"ranks", ranks},              {"arch", c.family},         {"layers", c.layers},
            {"heads", c.heads},            {"channels", c.channels},   {"vocab", c.vocab},
            {"context", c.context},        {"precision", o.run.precision_name()},
            {"batch", o.run.micro_batch},  {"seq", o.run.seq},         {"accum", o.run.accumulation},
            {"optimizer_state", std::string(moment_storage_name(o.run.moments))},
            {"master", std::string(master_storage_name(o.run.master))},
            {"data", o.data},              {"val", o.val},             {"alphabet", o.alphabet}};
}

// Throws ConfigError naming the first option that differs from the saved run's.
inline void check_resume_identity(const std::string& path, const std::string& saved_text, const nlohmann::json& now) {
    nlohmann::json saved;
    try {
        saved = nlohmann::json::parse(saved_text);
    } catch (const nlohmann::json::exception&) {
        throw FileError(path + ": its run description is not JSON; was it written by train_gpt?");
    }
    // A state saved before data parallelism was one process's, and one saved
    // before the engine took other families a GPT-2's.
    if (!saved.contains("ranks")) saved["ranks"] = 1;
    if (!saved.contains("arch")) saved["arch"] = "gpt2";
    const auto is_layout = [](const std::string& key) { return key == "ranks" || key == "batch" || key == "accum"; };
    for (const auto& [key, value] : now.items()) {
        if (!saved.contains(key))
            throw ConfigError("--resume " + path + ": the saved run does not record '" + key + "'");
        if (!is_layout(key) && saved[key] != value)
            throw ConfigError("--resume " + path + ": " + key + " was " + saved[key].dump() +
                              " in the saved run but is " + value.dump() + " now; resume with the same value");
    }
    const auto sequences = [](const nlohmann::json& j) {
        return j["ranks"].get<std::int64_t>() * j["batch"].get<std::int64_t>() * j["accum"].get<std::int64_t>();
    };
    const auto layout = [](const nlohmann::json& j) {
        const std::int64_t r = j["ranks"].get<std::int64_t>();
        return std::to_string(r) + (r == 1 ? " rank" : " ranks") + " x micro-batch " + j["batch"].dump() +
               " x accumulation " + j["accum"].dump();
    };
    if (sequences(saved) != sequences(now))
        throw ConfigError("--resume " + path + ": the saved run took " + std::to_string(sequences(saved)) +
                          " sequences per update (" + layout(saved) + ") but this one takes " +
                          std::to_string(sequences(now)) + " (" + layout(now) +
                          "); ranks x --batch x --accum may change, their product may not");
}

// ---- one run -----------------------------------------------------------------------

// The weights of a model being trained, in fp32: the optimizer's master copy
// for 16-bit types, the parameters themselves for fp32 and for bf16 weights
// trained without a master copy (widened exactly). A master copy sharded
// across ranks (ZeRO-1) is gathered on rank 0: every rank calls this then,
// and rank 0's answer is the one that holds every weight.
template <class Step, class Dev>
std::vector<float> master_weights(Step& step, const Dev& dev, dist::Ranks& ranks = dist::single_process()) {
    using Act = typename Step::Act;
    const std::int64_t P = step.model().num_parameters();
    std::vector<float> w(static_cast<std::size_t>(P));
    if (step.sharded() && step.optimizer().master() != nullptr) {
        // Only the master copy: the moments stay where they are.
        const dist::GatheredState g = dist::gather_state(step.optimizer(), dev, ranks, 0, master_weights_buffer);
        for (const StateBuffer& b : g.buffers)
            if (b.count == P) std::copy_n(static_cast<const float*>(b.data), P, w.begin());
        return w;
    }
    if constexpr (std::is_same_v<Act, float>) {
        download(dev, w.data(), step.model().parameters(), P);
    } else if (step.optimizer().master() != nullptr) {
        if (step.optimizer().offloaded())
            download(Host{}, w.data(), step.optimizer().master(), P);
        else
            download(dev, w.data(), step.optimizer().master(), P);
    } else {
        std::vector<Act> working(w.size());
        download(dev, working.data(), step.model().parameters(), P);
        std::transform(working.begin(), working.end(), w.begin(), [](Act x) { return static_cast<float>(x); });
    }
    return w;
}

// --model-dtype: fp32 (llm.c version 3) or bf16 (version 5); anything else
// throws ConfigError naming it.
inline io::LlmcVersion llmc_version(const std::string& dtype) {
    if (dtype == "fp32") return io::LlmcVersion::fp32;
    if (dtype == "bf16") return io::LlmcVersion::bf16;
    throw ConfigError("model dtype '" + dtype + "': an llm.c model file holds fp32 or bf16 parameters");
}

// Makes the directories a run writes into (--out, --export-hf, and the one
// --save-model's file goes in) before anything trains, so a run cannot end
// unable to keep what it was asked to keep. Throws snug::Error naming the
// option and the path: a directory that cannot be made, or --save-model
// naming a directory.
inline void prepare_output_directories(const TrainOptions& o) {
    io::make_directories(o.out, "--out");
    io::make_directories(o.export_hf, "--export-hf");
    if (!o.save_model.empty()) {
        const std::filesystem::path file(o.save_model);
        if (std::filesystem::is_directory(file))
            throw Error("--save-model " + o.save_model + ": is a directory; give the model file's name (e.g. " +
                        (file / "model.bin").string() + ")");
        io::make_directories(file.parent_path(), "--save-model's directory");
    }
}

// The model files asked for at the end: --save-model (llm.c, GPT-2) and
// --export-hf (GPT-2, Llama). (check_model_files refuses what a family has none of.)
template <class Config>
void write_model_files(const TrainOptions& o, const Config& config, const std::vector<float>& weights,
                       Report& report) {
    if constexpr (std::is_same_v<Config, GPTConfig>) {
        if (!o.save_model.empty()) {
            const io::LlmcVersion version = llmc_version(o.model_dtype);
            io::write_llmc_model(o.save_model, config, weights, version);
            report.file_written("model", o.save_model + " (llm.c, version " +
                                             std::to_string(static_cast<int>(version)) + ", " + o.model_dtype + ")");
        }
        if (!o.export_hf.empty()) {
            io::export_hf_gpt2(o.export_hf, config, weights);
            report.file_written("model", o.export_hf + "/model.safetensors + config.json (Hugging Face GPT-2)");
        }
    } else if constexpr (std::is_same_v<Config, LlamaConfig>) {
        if (!o.export_hf.empty()) {
            io::export_hf_llama(o.export_hf, config, weights);
            report.file_written("model", o.export_hf + "/model.safetensors + config.json (Hugging Face Llama)");
        }
    }
}

// summary.json: the summary table's numbers and the run's configuration.
inline void write_summary_json(const TrainOptions& o, const RunResult& r, const TrainData& data, const DeviceInfo& device,
                               const char* precision, Report& report) {
    const RunSummary& summary = r.summary;
    auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
    const nlohmann::json j = {
        {"steps", summary.steps},
        {"tokens", summary.tokens},
        {"wall_clock_seconds", summary.wall_clock},
        {"median_tokens_per_second", opt(summary.median_tokens_per_second)},
        {"median_mfu", opt(summary.median_mfu)},
        {"final_train_loss", opt(summary.final_train_loss)},
        {"first_val_loss", opt(r.first_val_loss)},
        {"final_val_loss", opt(summary.final_val_loss)},
        {"loss_floor", opt(data.floor)},
        {"total_model_flops", summary.total_model_flops},
        {"flops_budget", summary.flops_budget},
        {"loss_at_equal_flops", opt(summary.loss_at_equal_flops)},
        {"peak_bytes_total", r.peak_total},
        {"device", device.description},
        {"precision", precision},
        {"checkpoint", o.run.checkpoint_name()},
        {"optimizer_state", std::string(moment_storage_name(o.run.moments))},
        {"master", std::string(master_storage_name(o.run.master))},
        {"offload", o.run.offload},
        {"host_peak_bytes", r.host_peak},
        {"recompute_plan", r.recompute_plan},
        {"attention", r.attention},
        {"micro_batch", o.run.micro_batch},  // per rank
        {"ranks", o.ranks},
        {"zero", o.zero},
        {"seq", o.run.seq},
        {"accumulation", o.run.accumulation},
    };
    const std::string text = j.dump(2) + "\n";
    io::atomic_write(std::filesystem::path(o.out) / "summary.json",
                           [&](io::FileWriter& w) { w.write(text.data(), text.size()); });
    report.file_written("metrics", o.out + "/metrics.jsonl, " + o.out + "/summary.json");
}

template <class Dev, class Precision, class Config>
RunResult train(const TrainOptions& o, const TrainData& data, const ModelSourceOf<Config>& source,
                const DeviceInfo& device, Report& report, const snug::data::Tokenizer* tokenizer = nullptr,
                dist::Ranks& ranks = dist::single_process(), dist::Communicator<Dev>* communicator = nullptr) {
    using Model = model_of<Config, typename Precision::compute_type, Dev>;
    // One step type per precision: the checkpoint policy of the options is
    // turned into its recompute plan here (checkpoint::Given), so a program
    // compiles three run loops, not one per precision and policy.
    using Step = TrainStep<Model, Precision, accumulate::Steps, checkpoint::Given>;
    const Config& config = source.config;
    const ModelSummary summary = model_summary(config);
    const int B = o.run.micro_batch, T = o.run.seq, n = o.run.accumulation;
    const std::int64_t BT = std::int64_t{B} * T;
    const int N = ranks.size(), rank = ranks.rank();
    if (o.ranks != N)
        throw ConfigError("the options were made for " + std::to_string(o.ranks) + " data-parallel ranks, but the job has " +
                          std::to_string(N) + " (set TrainOptions::ranks from dist::Ranks::size())");
    const bool writer = rank == 0;  // rank 0 writes the files (every rank computes the same)
    if (writer) prepare_output_directories(o);
    RunResult result;
    Session<Dev> s(o.budget_bytes);
    try {
        // On the host a model too large for the machine fails in malloc:
        // name_allocation says what and how much instead of std::bad_alloc.
        const auto P = static_cast<std::size_t>(summary.parameters);
        constexpr std::size_t act_bytes = sizeof(typename Precision::compute_type);
        std::optional<Model> model_storage;
        name_allocation("the model's parameters and fp32 gradients (" + std::to_string(P) + " parameters)",
                        P * (act_bytes + sizeof(float)), [&] { model_storage.emplace(config, s.tracker); });
        Model& model = *model_storage;
        model.load_weights(s.ctx.device, source.weights);
        result.attention = attention_path<typename Model::value_type>(summary.attention, s.ctx.device, B, T,
                                                                     summary.channels, summary.heads, summary.kv_heads);
        if (summary.heads > 0) report.attention(result.attention);  // (a family without heads has none)
        Buffer<std::int32_t, Dev> tokens_dev(s.tracker, MemoryCategory::workspace, static_cast<std::size_t>(n * BT),
                                             "token ids");   // (n, B, T)
        Buffer<std::int32_t, Dev> targets_dev(s.tracker, MemoryCategory::workspace, static_cast<std::size_t>(n * BT),
                                              "target ids");  // (n, B, T)

        // The options' policy as the plan it picks for this model and shape;
        // --checkpoint auto: the first plan of growing recompute whose whole
        // run the planner fits in the budget (no budget: keep everything).
        std::optional<std::vector<Recompute>> automatic;
        if (o.run.checkpoint == CheckpointKind::automatic) {
            automatic = auto_recompute_plan(o, config, s.plan_target());
            report.activation_budget(automatic ? std::optional<std::size_t>(activation_peak(
                                                     config, o.run.precision, B, T, *automatic))
                                               : std::nullopt);
        }
        const checkpoint::Given checkpoint{recompute_plan_of(o, config, automatic)};
        TrainConfig tc;
        tc.adamw.weight_decay = o.weight_decay;
        tc.adamw.moments = o.run.moments;
        tc.adamw.master = o.run.master;
        tc.adamw.offload = o.run.offload;
        tc.max_grad_norm = o.clip;
        const bool master_copy = act_bytes < sizeof(float) && o.run.master == MasterStorage::fp32;
        // --zero: this rank keeps its shard of the optimizer's state (ZeRO-1).
        tc.shards = o.zero_ranks();
        tc.shard = o.zero ? rank : 0;
        using Opt = AdamW<typename Model::value_type, Dev>;
        const std::vector<std::int64_t> cuts = Opt::shard_cuts(model.num_parameters(), model.parameter_groups(), tc.shards);
        const auto [moment_bytes, master_bytes] = Opt::state_bytes(
            model.num_parameters(), model.parameter_groups(), tc.adamw, ParameterShard{cuts[tc.shard], cuts[tc.shard + 1]});
        const std::size_t state_bytes = moment_bytes + master_bytes;
        std::optional<Step> step_storage;
        name_allocation("the optimizer's state (AdamW " + std::string(moment_storage_name(o.run.moments)) +
                            " moments" + std::string(master_copy ? " and fp32 master weights)" : ")"),
                        state_bytes, [&] {
                            step_storage.emplace(model, s.tracker, s.ctx.device, source.weights, tc,
                                                 Precision{}, accumulate::Steps(n), checkpoint);
                        });
        Step& step = *step_storage;
        // The program's communicator (NCCL on GPUs), else sums staged through the host over `ranks`.
        std::optional<dist::Communicator<Dev>> staged;
        if (communicator == nullptr) communicator = &staged.emplace(ranks);
        step.data_parallel(*communicator);
        if (N > 1)
            report.data_parallel(N,
                                 ranks.description() +
                                     (step.overlaps_backward() ? ", gradient sums overlapping the backward" : ""),
                                 B, std::int64_t{N} * n * BT, step.sharded());

        const LrSchedule schedule{o.lr, o.warmup, o.steps, o.min_lr_frac};
        schedule.validate();
        // Every rank reads the same global batches of N·B sequences and trains
        // on its own B of them (rows rank·B ...): the tokens one process with
        // micro-batch N·B would see, and one data position to save.
        snug::data::BatchLoader train_loader(data.train, N * B, T, "training data");
        snug::data::BatchLoader val_loader(data.val, N * B, T, "validation data");
        std::vector<std::int32_t> host_tokens(static_cast<std::size_t>(n * BT)), host_targets(host_tokens.size());
        std::vector<std::int32_t> global_tokens(static_cast<std::size_t>(N * BT)), global_targets(global_tokens.size());
        std::vector<MicroBatch> batches;
        for (int m = 0; m < n; ++m) batches.push_back({tokens_dev.data() + m * BT, targets_dev.data() + m * BT});

        // --resume: weights, master weights, moments, scaler, data position, step.
        const nlohmann::json identity = run_identity(o, config, N);
        if (N > 1) {
            const std::string text = identity.dump();
            if (!ranks.all_equal(dist::fingerprint(text.data(), text.size()), "check of the ranks' options"))
                throw ConfigError("the data-parallel ranks were started with different options (this is rank " +
                                  std::to_string(rank) + " of " + std::to_string(N) + ": " + text +
                                  "); start every rank with the same command line");
        }
        std::int64_t first_step = 0;
        double wall_offset = 0.0;
        if (!o.resume.empty()) {
            const TrainingProgress p = load_training_state(o.resume, step, s.ctx.device);
            check_resume_identity(o.resume, p.run_config, identity);
            first_step = p.step;
            wall_offset = p.wall_clock_seconds;
            if (first_step >= o.steps)
                throw ConfigError("--resume " + o.resume + ": the saved run already did " +
                                  std::to_string(first_step) + " updates; ask for more with --steps");
            train_loader.set_position(p.train_position);
            s.ctx.seed = p.seed;
            s.ctx.rng_offset = p.rng_offset;
            report.resumed(o.resume, first_step, wall_offset);
        }
        const std::string state_path = o.state_path();
        auto save_state = [&](std::int64_t done, double wall) {
            if (state_path.empty()) return;
            StateFileOptions file_options;
            std::optional<dist::GatheredState> gathered;
            if (N > 1) {
                // Data parallel keeps every rank's weights the same bits; a
                // rank that drifted would make the saved state a lie.
                using Act = typename Model::value_type;
                std::vector<Act> w(static_cast<std::size_t>(model.num_parameters()));
                download(s.ctx.device, w.data(), model.parameters(), model.num_parameters());
                if (!ranks.all_equal(dist::fingerprint(w.data(), w.size() * sizeof(Act)), "check of the ranks' weights"))
                    throw Error("update " + std::to_string(done) + ": the data-parallel ranks' weights differ (rank " +
                                std::to_string(rank) + " of " + std::to_string(N) +
                                "); the state is not saved, the last saved one is kept");
                // ZeRO-1: the file holds the whole state, gathered on rank 0
                // (the same file an unsharded run writes).
                if (step.sharded()) {
                    gathered.emplace(dist::gather_state(step.optimizer(), s.ctx.device, ranks, 0));
                    file_options.optimizer_state = gathered->buffers;
                }
            }
            if (!writer) return;
            TrainingProgress p;
            p.step = done;
            p.tokens = done * n * BT * N;
            p.train_position = train_loader.position();
            p.seed = s.ctx.seed;
            p.rng_offset = s.ctx.rng_offset;
            p.wall_clock_seconds = wall;
            p.run_config = identity.dump();
            save_training_state(state_path, step, s.ctx.device, p, file_options);
        };

        // The same batches every time, so losses compare; like training,
        // each rank takes its B rows of every global batch of N·B, and the
        // ranks add their mean losses.
        auto evaluate = [&]() {
            val_loader.set_position(0);
            double sum = 0.0;
            for (int i = 0; i < o.eval_batches; ++i) {
                val_loader.next(global_tokens.data(), global_targets.data());
                upload(s.ctx.device, tokens_dev.data(), global_tokens.data() + rank * BT, BT);
                upload(s.ctx.device, targets_dev.data(), global_targets.data() + rank * BT, BT);
                sum += model.evaluate(s.ctx, tokens_dev.data(), targets_dev.data(), B, T);
            }
            return ranks.sum(sum, "validation loss sum") / (o.eval_batches * N);
        };

        std::optional<JsonLinesFile> jsonl;
        if (!o.out.empty() && writer) jsonl.emplace(std::filesystem::path(o.out) / "metrics.jsonl", /*append=*/!o.resume.empty());
        // MFU over all ranks' devices: the record's FLOPs are all ranks' tokens.
        auto peak = peak_flops(device.name, Precision::name);
        if (peak) *peak *= N;
        const double flops_per_token = summary.flops_per_token(T);

        // The first evaluation comes before the first update: it runs under
        // the plan the update will use (TrainStep applies it at its first step).
        model.set_recompute(checkpoint.modes);
        if (first_step == 0) {
            result.first_val_loss = evaluate();
            report.evaluation(0, *result.first_val_loss, data.floor);
        }

        result.records.reserve(static_cast<std::size_t>(o.steps - first_step));
        using clock = std::chrono::steady_clock;
        const auto start = clock::now();
        auto wall = [&] { return wall_offset + std::chrono::duration<double>(clock::now() - start).count(); };
        for (std::int64_t i = first_step; i < o.steps; ++i) {
            const float lr = schedule(static_cast<int>(i));
            const auto t0 = clock::now();
            for (int m = 0; m < n; ++m) {
                train_loader.next(global_tokens.data(), global_targets.data());
                std::copy_n(global_tokens.data() + rank * BT, BT, host_tokens.data() + m * BT);
                std::copy_n(global_targets.data() + rank * BT, BT, host_targets.data() + m * BT);
                upload(s.ctx.device, tokens_dev.data() + m * BT, host_tokens.data() + m * BT, BT);
                upload(s.ctx.device, targets_dev.data() + m * BT, host_targets.data() + m * BT, BT);
            }
            const StepResult r = step.step(s.ctx, batches, B, T, lr);
            const auto t1 = clock::now();
            result.driver_peak = std::max(result.driver_peak, s.driver_used_by_session());
            if (i == first_step) {
                result.recompute_plan = describe_plan(step.recompute_plan());
                report.recompute_plan(step.recompute_plan());
            }

            StepRecord rec;
            rec.step = i + 1;
            rec.train_loss = r.loss;
            rec.lr = lr;
            rec.grad_norm = r.grad_norm;
            rec.loss_scale = r.loss_scale;
            rec.skipped = r.skipped;
            rec.tokens = r.tokens;
            rec.seconds = std::chrono::duration<double>(t1 - t0).count();
            rec.model_flops = flops_per_token * static_cast<double>(r.tokens);
            rec.hardware_flops = rec.model_flops + summary.recompute_flops_per_token(T, step.recompute_plan()) *
                                                       static_cast<double>(r.tokens);
            rec.peak_flops_per_second = peak;
            for (MemoryCategory c : all_memory_categories)
                rec.peak_bytes[static_cast<std::size_t>(c)] = s.tracker.peak(c);
            rec.peak_total = s.tracker.peak_total();
            if ((i + 1) % o.eval_every == 0 || i + 1 == o.steps) rec.val_loss = evaluate();
            rec.wall_clock = wall();
            result.records.push_back(rec);

            if (jsonl) jsonl->write(to_json(rec));
            report.progress(rec, o.steps);
            if (rec.val_loss) report.evaluation(rec.step, *rec.val_loss, data.floor);
            if (!std::isfinite(r.loss) && !Precision::has_loss_scaler) {
                report.diverged(rec.step, r.loss);
                result.exit_code = 1;
                break;
            }
            // One rank's Ctrl-C (or mpirun's forwarded signal) stops every rank here.
            const bool signalled = N > 1 ? ranks.any(stop_requested.load(), "check for a stop request")
                                         : stop_requested.load();
            const bool stopping = signalled || (o.stop_after > 0 && i + 1 == o.stop_after && i + 1 < o.steps);
            if (stopping || (o.save_every > 0 && (i + 1) % o.save_every == 0 && i + 1 < o.steps)) {
                save_state(i + 1, rec.wall_clock);
                if (stopping) {
                    report.stopped(rec.step, signalled, state_path);
                    result.interrupted = true;
                    result.exit_code = signalled ? 130 : 0;
                    break;
                }
            }
        }
        for (MemoryCategory c : all_memory_categories)
            result.peak_bytes[static_cast<std::size_t>(c)] = s.tracker.peak(c);
        result.at_peak = s.tracker.peak_breakdown();
        result.peak_total = s.tracker.peak_total();
        result.host_peak = step.optimizer().host_memory().peak_total();
        result.summary = summarize(
            result.records, o.flops_budget > 0.0 ? std::optional<double>(o.flops_budget) : std::nullopt, data.floor);
        result.summary.first_val_loss = result.first_val_loss;
        result.summary.host_peak = result.host_peak;
        if (result.interrupted || result.exit_code != 0) return result;

        save_state(o.steps, wall());
        report.summary(result.summary, step.skipped_steps());
        std::vector<float> final_weights;  // every rank takes part when ZeRO-1 gathers them
        if (!o.save_model.empty() || !o.export_hf.empty()) final_weights = master_weights(step, s.ctx.device, ranks);
        if (!writer) return result;
        if (!state_path.empty()) report.file_written("state", state_path);
        if (!o.out.empty()) write_summary_json(o, result, data, device, Precision::name, report);
        if (!o.save_model.empty() || !o.export_hf.empty()) write_model_files(o, config, final_weights, report);

        if (o.sample > 0) report.sample(generate_sample(model, s, o, data, tokenizer));
    } catch (const OutOfMemory& e) {
        result.fit = false;
        result.exit_code = 3;
        result.out_of_memory = e.what();
        for (MemoryCategory c : all_memory_categories)
            result.peak_bytes[static_cast<std::size_t>(c)] = s.tracker.peak(c);
        result.at_peak = s.tracker.peak_breakdown();
        result.peak_total = s.tracker.peak_total();
    }
    return result;
}

// --eval-only: the validation loss of a model (--init-from, or a fresh one)
// over --eval-batches windows of the validation data; nothing is trained.
template <class Dev, class Act, class Config>
int evaluate_only(const TrainOptions& o, const TrainData& data, const ModelSourceOf<Config>& source, Report& report,
                  const snug::data::Tokenizer* tokenizer) {
    const int B = o.run.micro_batch, T = o.run.seq;
    const std::int64_t BT = std::int64_t{B} * T;
    Session<Dev> s(o.budget_bytes);
    model_of<Config, Act, Dev> model(source.config, s.tracker);
    model.load_weights(s.ctx.device, source.weights);
    Buffer<std::int32_t, Dev> tokens_dev(s.tracker, MemoryCategory::workspace, static_cast<std::size_t>(BT),
                                         "token ids");   // (B, T)
    Buffer<std::int32_t, Dev> targets_dev(s.tracker, MemoryCategory::workspace, static_cast<std::size_t>(BT),
                                          "target ids");  // (B, T)
    snug::data::BatchLoader loader(data.val, B, T, "validation data");
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(BT)), targets(tokens.size());
    // Whole windows only, each once: at most --eval-batches of them.
    const std::int64_t windows = std::min<std::int64_t>(o.eval_batches, (std::int64_t(data.val.size()) - 1) / BT);
    double sum = 0.0;
    for (std::int64_t i = 0; i < windows; ++i) {
        loader.next(tokens.data(), targets.data());
        upload(s.ctx.device, tokens_dev.data(), tokens.data(), BT);
        upload(s.ctx.device, targets_dev.data(), targets.data(), BT);
        sum += model.evaluate(s.ctx, tokens_dev.data(), targets_dev.data(), B, T);
    }
    const double loss = sum / static_cast<double>(windows);
    report.evaluated({loss, windows, B, T, data.floor, s.tracker.peak_total()});
    if (o.sample > 0) report.sample(generate_sample(model, s, o, data, tokenizer));
    return std::isfinite(loss) ? 0 : 1;
}

// One training run on device Dev with the options' precision (the static
// type) and checkpoint policy (its plan).
template <class Dev, class Config>
RunResult run_training(const TrainOptions& o, const TrainData& data, const ModelSourceOf<Config>& source,
                       const DeviceInfo& device, Report& report, const snug::data::Tokenizer* tokenizer = nullptr,
                       dist::Ranks& ranks = dist::single_process(), dist::Communicator<Dev>* communicator = nullptr) {
    return visit_precision(o.run.precision, [&]<class Precision>() {
        return train<Dev, Precision, Config>(o, data, source, device, report, tokenizer, ranks, communicator);
    });
}

// --eval-only on device Dev in the options' precision.
template <class Dev, class Config>
int run_evaluation(const TrainOptions& o, const TrainData& data, const ModelSourceOf<Config>& source, Report& report,
                   const snug::data::Tokenizer* tokenizer = nullptr) {
    return visit_precision(o.run.precision, [&]<class Precision>() {
        return evaluate_only<Dev, typename Precision::compute_type, Config>(o, data, source, report, tokenizer);
    });
}

}  // namespace snug
