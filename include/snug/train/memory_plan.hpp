// What the memory planner (planner.hpp) is asked and answers, as plain data:
// the precision known at run time, what a device reserves, the shape of a
// run, the predicted plan, and the answers of the searches (the fastest
// configuration for a budget, the largest model that fits, the outlook before
// a run). Apart from the planner so that code which only shows or stores
// these (snug/report/text_report.hpp, the state file) needs no model, no
// metering device and no TrainStep.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "snug/checkpoint/recompute.hpp"
#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/nn/gpt_config.hpp"
#include "snug/nn/model_summary.hpp"
#include "snug/ops/fused_attention.hpp"
#include "snug/optim/state_storage.hpp"
#include "snug/cuda/limits.hpp"
#include "snug/precision/kind.hpp"
#include "snug/precision/policies.hpp"

namespace snug {

// The precision a plan is for: PrecisionKind (snug/precision/kind.hpp).

// ---- what is predicted -------------------------------------------------------------

// What a device reserves beyond the bytes the tracker counts.
struct DeviceReservation {
    std::size_t granularity = 1;  // every allocation is counted in whole units of this many bytes
    std::size_t context = 0;      // the runtime's own memory, allocated before anything of ours
};

// A stated estimate for a CUDA card, to be checked against the driver by the
// ladder's driver column on a GPU: cudaMalloc maps whole 2 MiB pages (small
// allocations are counted as a whole page: a few MiB too many); the context
// with cuBLASLt's kernels loaded lazily (CUDA 12+) takes a few hundred MiB —
// 512 MiB is counted.
inline constexpr DeviceReservation cuda_reservation{std::size_t{2} << 20, std::size_t{512} << 20};

// What the device a run trains on adds to its plan: the backend's own tracked
// workspace (cuBLASLt's on CUDA) and what the device reserves beyond the
// tracker (none: the host, where the tracker's bytes are what a budget limits).
struct PlanTarget {
    std::size_t backend_workspace = 0;
    std::optional<DeviceReservation> device;
    // Its fused attention engine (cuDNN's SDPA; not owned), nullptr: none.
    // AttentionKind::cudnn layers ask it which calls it takes and their
    // workspace, on the metering device as on the real one.
    FusedAttentionPlanner* fused = nullptr;
};

// The shape of one training run, whatever the model, as a trainer like
// examples/train_gpt builds it: a MemoryTracker; the backend's workspace
// (cuBLASLt's on CUDA); two ActivationArenas (activations, and temporaries
// for backward); the model; token and target ids for the n micro-batches of
// an update, n·B·T int32 each, as workspace; TrainStep (AdamW, the
// gradient-norm scalar, the loss-scaler flag). Training, evaluation at
// (B, T) and, when sampling_window > 0, sampling (a window of that many int32
// ids in workspace, a forward pass at (1, window) without targets) all run
// with the same recompute modes.
struct RunShape {
    int micro_batch = 1;                // B: sequences per forward
    int seq = 1;                        // T: tokens per sequence, at most the model's context
    int accumulation = 1;               // n: micro-batches per update
    MomentStorage moments = MomentStorage::fp32;  // AdamW's moments (the optimizer-memory policy)
    MasterStorage master = MasterStorage::fp32;   // AdamW's master weights (none: bf16 weights only)
    bool offload = false;                         // AdamW's state in host memory, its update on the CPU
    int zero_ranks = 1;  // ZeRO-1: AdamW's state sharded over this many data-parallel ranks (the plan: the largest shard's rank)
    std::vector<Recompute> recompute;   // one mode per block; empty: every block keeps everything
    std::size_t backend_workspace = 0;  // the cuBLASLt workspace on CUDA (cuda::Blas::workspace_bytes()); 0 on the host
    int sampling_window = 0;            // int32 ids of the trainer's sampling window (train_gpt: max_seq_len); 0: none
    // The device whose memory a budget limits (e.g. cuda_reservation); none:
    // the budget limits the tracker's bytes (the host backend).
    std::optional<DeviceReservation> device;
    FusedAttentionPlanner* fused = nullptr;  // the device's fused attention engine (PlanTarget::fused)

    // The modes in force for a model of `blocks` blocks: recompute, or all
    // none when it is empty.
    std::vector<Recompute> modes(int blocks) const {
        if (!recompute.empty()) return recompute;
        return std::vector<Recompute>(static_cast<std::size_t>(blocks), Recompute::none);
    }
};

// A CUDA card of `memory` bytes as a plan counts it (what --plan counts on a
// GPU): a budget of its whole memory, checked against what the device
// reserves (cuda_reservation: the context, whole pages) with cuBLASLt's
// workspace (Hopper's, the larger, unless set). Made by snug::card:
//
//   using namespace snug::literals;
//   const snug::Card c = snug::card(12_GiB);
//   int B = snug::largest_micro_batch<Model, Precision>(config, shape, c);
struct Card {
    std::size_t memory = 0;
    std::size_t workspace = cuda::blas_workspace_bytes(9);
    DeviceReservation reservation = cuda_reservation;

    // `shape` as run on this card: its device and backend workspace set.
    RunShape on(RunShape shape) const {
        shape.device = reservation;
        shape.backend_workspace = workspace;
        return shape;
    }
};

constexpr Card card(std::size_t memory) { return Card{memory}; }

// A run of a model of `Config` (GPTConfig, CausalLMConfig<Family>: the model
// is model_of<Config, Act, D>): its config, precision and the run's shape.
template <class Config>
struct PlanInput : RunShape {
    Config model;
    PrecisionKind precision = PrecisionKind::fp32;

    // Throws ConfigError naming the first field that makes no sense.
    void validate() const {
        if constexpr (requires { model.validate(); }) model.validate();
        auto fail = [](const std::string& what) { throw ConfigError("memory plan: " + what); };
        if (micro_batch < 1) fail("micro_batch must be at least 1, got " + std::to_string(micro_batch));
        if (seq < 1 || seq > model.max_seq_len)
            fail("seq must be in [1, max_seq_len = " + std::to_string(model.max_seq_len) + "], got " +
                 std::to_string(seq));
        if (accumulation < 1) fail("accumulation must be at least 1, got " + std::to_string(accumulation));
        if (!recompute.empty() && recompute.size() != static_cast<std::size_t>(model.n_layer))
            fail("recompute has " + std::to_string(recompute.size()) + " modes for " +
                 std::to_string(model.n_layer) + " blocks");
        if (sampling_window < 0 || sampling_window > model.max_seq_len)
            fail("sampling_window must be in [0, max_seq_len = " + std::to_string(model.max_seq_len) + "], got " +
                 std::to_string(sampling_window));
    }

    std::vector<Recompute> modes() const { return RunShape::modes(model.n_layer); }
};

// A GPT's run.
using MemoryPlanInput = PlanInput<GPTConfig>;

// What the tracker will report after training with a MemoryPlanInput, and
// what the device will reserve.
struct MemoryPlan {
    MemoryBreakdown peak{};           // MemoryTracker::peak(c) per category
    std::size_t total = 0;            // MemoryTracker::peak_total()
    MemoryBreakdown at_total_peak{};  // MemoryTracker::peak_breakdown()
    std::string peak_moment;          // when the total peaks, e.g. "training: when \"qkv\" is allocated"
    // The most the device holds at once: every allocation at the device's
    // granularity, the arenas' chunks whole (not their live bytes), plus the
    // context. Without a device in the input: the allocations' exact bytes.
    std::size_t reserved = 0;
    // The part of `reserved` that is the device's context (0 without a device).
    std::size_t context = 0;
    // What a budget is checked against: `reserved` for a device, else `total`.
    std::size_t required = 0;
    // Host memory an offloaded optimizer holds (its state, the host copy of
    // the weights and the gradient chunks in flight, as on CUDA); 0 unless
    // offloaded. No device budget counts it.
    std::size_t host = 0;

    std::size_t operator[](MemoryCategory c) const { return peak[static_cast<std::size_t>(c)]; }
};

// ---- what the searches answer ------------------------------------------------------

// One checkpoint policy the budget search tried.
struct PolicyTry {
    std::string checkpoint;
    int micro_batch = 0;          // the largest that fits among the divisors of the wanted batch; 0: none
    std::size_t bytes = 0;        // the predicted total there (at micro-batch 1 when none fits)
};

// The fastest configuration for a budget, by the order of operations.
struct BudgetPlan {
    bool fits = false;            // false: no policy fits even micro-batch 1
    std::size_t budget = 0;
    int wanted_batch = 0;         // sequences per update
    int seq = 0;
    std::string checkpoint;       // the chosen policy ("none", "selective", "every:4", ...)
    std::vector<Recompute> recompute;
    int micro_batch = 0;          // B
    int accumulation = 0;         // n = wanted_batch / B
    MemoryPlan memory;            // of the chosen configuration
    std::optional<int> next_micro_batch;          // the next larger divisor, which did not fit
    std::optional<std::size_t> next_micro_batch_bytes;  // and what it would need
    std::vector<PolicyTry> tried; // every policy looked at, in order, the chosen one last
};

// The largest model of a family that fits.
struct ModelFit {
    int depth = 0;                // 0: not even depth 1 fits
    ModelSummary model;
    std::size_t budget = 0;
    std::string checkpoint;       // the cheapest policy that fits at this depth
    std::vector<Recompute> recompute;
    MemoryPlan memory;
    std::size_t next_depth_bytes = 0;  // the least any policy needs one block deeper
    bool at_limit = false;             // depth is the search's limit; deeper ones were not tried
};

// Before a run: the predicted peak, the bytes each sequence adds, and (with a
// budget) the largest micro-batch that fits.
struct MemoryOutlook {
    MemoryPlan plan;
    std::size_t bytes_per_sequence = 0;
    int seq = 0;
    std::optional<std::size_t> budget;
    int largest_micro_batch = 0;          // with a budget; 0: none fits
    std::size_t micro_batch_1_bytes = 0;  // with a budget: what micro-batch 1 needs
};

}  // namespace snug
