// What a training program tells its reader, as events that carry numbers, not
// text. The engine (run.hpp, run_plan.hpp, ladder.hpp) calls a Report; the
// program decides how each event is shown. The base class shows nothing (the
// ladder's inner runs, tests); snug/report/text_report.hpp prints every event
// for a terminal, with fmt.
//
// Why an interface and not a few print functions: in a CUDA program the
// engine is compiled by nvcc, and Debian's fmt 9.1 does not compile there. So
// this header stays free of fmt, and the text is host code — a program builds
// its TextReport in a file the host compiler compiles (examples/train_gpt/
// report.cpp) and hands the engine a Report&.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "snug/checkpoint/recompute.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/nn/gpt_config.hpp"
#include "snug/nn/model_summary.hpp"
#include "snug/train/data_source.hpp"
#include "snug/train/device_info.hpp"
#include "snug/train/memory_plan.hpp"
#include "snug/train/metrics.hpp"
#include "snug/train/options.hpp"

namespace snug {

// What a run measured: the ladder reads it; train_gpt prints it.
struct RunResult {
    int exit_code = 0;              // 0 done, 1 numerics, 3 out of the memory budget, 130 stopped by Ctrl-C
    bool fit = true;                // false: OutOfMemory (out_of_memory says where)
    std::string out_of_memory;      // the tracker's breakdown
    bool interrupted = false;
    std::vector<StepRecord> records;
    RunSummary summary;
    std::optional<double> first_val_loss;
    std::string recompute_plan;     // describe_plan of the plan TrainStep applied
    std::string attention;          // what computed attention at the training shape (nn/attention.hpp's attention_path)
    MemoryBreakdown peak_bytes{};   // each category's own peak
    MemoryBreakdown at_peak{};      // the categories at the moment of the total's peak (they sum to it)
    std::size_t peak_total = 0;
    std::size_t driver_peak = 0;    // CUDA: the driver's used memory for this run (Session); 0 on the host
    std::size_t host_peak = 0;      // an offloaded optimizer's host memory (state and staging); 0 otherwise
};

// One rung of the VRAM ladder (ladder.hpp): its configuration, what it
// measured, the planner's prediction.
struct LadderRung {
    std::string name;
    std::string note;
    TrainOptions options;                // options.run: precision, batch, accum, seq, checkpoint
    bool ran = false;
    bool held = true;                    // false: not run, the device cannot hold its predicted peak
    bool needed = true;                  // false: rung 3 when the wanted batch fits as one micro-batch
    RunResult result;
    MemoryPlan predicted;
    bool fits = false;                   // peak (measured, else predicted) within the budget
    std::optional<double> loss_at_equal_flops;
    std::optional<double> mean_loss_over_flops;  // area under loss vs FLOPs / F
};

// --plan's answer: the configuration as asked, the fastest that fits, the
// largest model of the family.
struct PlanAnswer {
    DeviceInfo device;
    std::size_t budget = 0;
    ModelSummary model;
    RunSpec run;
    MemoryOutlook asked;
    BudgetPlan fastest;
    // When nothing fits and the run's optimizer state is not the leanest:
    // the same search with lean state (the order of operations' next step).
    std::optional<RunSpec> lean_run;
    std::optional<BudgetPlan> lean;
    // When that does not fit either and the optimizer is on the device: the
    // search with the run's own optimizer state offloaded to the host.
    std::optional<RunSpec> offload_run;
    std::optional<BudgetPlan> offloaded;
    // When none of those fits: the fewest data-parallel ranks (2, 4, ...,
    // 64) whose cards each fit the budget with the run's optimizer state
    // sharded across them (ZeRO-1); the last tried when none does.
    std::optional<RunSpec> zero_run;
    std::optional<BudgetPlan> zero;
    ModelFit largest;
};

// The text generated at the end of a run.
struct Sample {
    float temperature = 0.0f;
    int top_k = 0;            // 0: all tokens
    std::string prompt;       // as shown
    std::string text;         // prompt and continuation
};

// --eval-only's measurement.
struct Evaluation {
    double loss = 0.0;
    std::int64_t windows = 0;
    int micro_batch = 0;
    int seq = 0;
    std::optional<double> floor;
    std::size_t peak_bytes = 0;
};

// The ladder's table: its setting, every rung, the FLOPs its losses are
// compared at and the checkpointing rule it applied.
struct LadderTable {
    ModelSummary model;
    int seq = 0;
    int sequences_per_update = 0;
    int updates = 0;
    std::optional<std::size_t> budget;
    std::string device;
    double common_flops = 0.0;
    std::string rule;
};

// The ladder's plots: drawn (exit_code 0), or not and the command that would.
struct LadderPlots {
    int exit_code = 0;        // the plot script's; 3: no matplotlib; 127: no python3
    std::string dir;
    std::string command;
};

class Report {
public:
    virtual ~Report() = default;

    // Before anything runs.
    virtual void device(const DeviceInfo&) {}
    virtual void model(const ModelSummary&, int /*seq*/, const std::string& /*source*/) {}
    virtual void data(const TrainData&) {}
    virtual void training_setup(const TrainOptions&) {}
    // Data parallel: `ranks` processes (`how`: "MPI (Open MPI v4.1.4)"), each
    // with micro-batch `micro_batch`, `tokens_per_update` tokens an update in
    // all; `zero1`: the optimizer's state sharded across them.
    virtual void data_parallel(int /*ranks*/, const std::string& /*how*/, int /*micro_batch*/,
                               std::int64_t /*tokens_per_update*/, bool /*zero1*/) {}
    virtual void memory_outlook(const MemoryOutlook&) {}
    virtual void plan(const PlanAnswer&) {}

    // A run, in order.
    // checkpoint auto: the activations its plan keeps at their peak; nullopt: no budget, nothing recomputed
    virtual void activation_budget(std::optional<std::size_t> /*bytes*/) {}
    virtual void resumed(const std::string& /*path*/, std::int64_t /*step*/, double /*wall_clock_seconds*/) {}
    virtual void recompute_plan(std::span<const Recompute>) {}
    // What computes attention at the training shape: "flash kernels", cuDNN's engine, ...
    virtual void attention(const std::string& /*path*/) {}
    virtual void evaluation(std::int64_t /*step*/, double /*loss*/, std::optional<double> /*floor*/) {}
    virtual void progress(const StepRecord&, std::int64_t /*total_steps*/) {}
    virtual void diverged(std::int64_t /*step*/, double /*loss*/) {}
    virtual void stopped(std::int64_t /*step*/, bool /*signalled*/, const std::string& /*state_path*/) {}
    virtual void summary(const RunSummary&, std::int64_t /*skipped_updates*/) {}
    // A file the run wrote: what it is ("state", "metrics", "model") and where.
    virtual void file_written(std::string_view /*what*/, const std::string& /*where*/) {}
    virtual void sample(const Sample&) {}
    virtual void evaluated(const Evaluation&) {}

    // The VRAM ladder.
    virtual void rung_started(const LadderRung&) {}
    virtual void rung_finished(const LadderRung&) {}
    virtual void rung_not_needed(const LadderRung&) {}
    virtual void ladder_rule(const std::string&) {}
    virtual void ladder_table(const LadderTable&, const std::vector<LadderRung>&) {}
    virtual void ladder_files(const std::string& /*dir*/) {}
    virtual void ladder_plots(const LadderPlots&) {}
};

}  // namespace snug
