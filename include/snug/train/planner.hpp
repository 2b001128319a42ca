// The memory planner: what a GPT training run will hold, per MemoryCategory,
// predicted before anything is allocated — to the byte for the tracker of a
// trainer built like examples/train_gpt (TrainStep<GPT>, its token buffers,
// its sampling window) — and the searches built on it: the largest
// micro-batch for a budget, the configuration `--plan` recommends (following
// the order of operations) and the largest model of a family that fits.
//
// The tracker's peak_total() is not the sum of the category peaks: the
// activations peak at the end of the forward pass, backward's temporaries
// while the activations are already shrinking. predict_memory() therefore
// walks one training update moment by moment (every point where the
// activation arena, the scratch arena or their sum reaches a local maximum)
// and takes the highest sum, not the sum of the highest.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "snug/checkpoint/policies.hpp"
#include "snug/core/bytes.hpp"
#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/nn/gpt_config.hpp"
#include "snug/nn/gpt_memory.hpp"
#include "snug/nn/layer_stack.hpp"
#include "snug/precision/policies.hpp"

namespace snug {

// ---- precision, known at run time ------------------------------------------------

// The precision policy a plan is for (precision::Fp32, Bf16, Fp16<Scaler>).
// The loss scaler takes no memory of its own: TrainStep keeps its overflow
// flag under every policy.
enum class PrecisionKind : std::uint8_t { fp32, bf16, fp16 };

constexpr std::string_view precision_name(PrecisionKind p) {
    switch (p) {
        case PrecisionKind::fp32: return "fp32";
        case PrecisionKind::bf16: return "bf16";
        case PrecisionKind::fp16: return "fp16";
    }
    return "?";
}

// Bytes of one activation or working weight.
constexpr std::size_t compute_bytes(PrecisionKind p) { return p == PrecisionKind::fp32 ? 4 : 2; }

// 16-bit working weights come with fp32 master weights in the optimizer.
constexpr bool keeps_master_weights(PrecisionKind p) { return p != PrecisionKind::fp32; }

// "fp32", "bf16" or "fp16"; anything else throws ConfigError naming it.
inline PrecisionKind parse_precision_kind(std::string_view s) {
    for (PrecisionKind p : {PrecisionKind::fp32, PrecisionKind::bf16, PrecisionKind::fp16})
        if (s == precision_name(p)) return p;
    throw ConfigError("precision '" + std::string(s) + "': expected fp32, bf16 or fp16");
}

namespace detail {
template <class>
inline constexpr bool unknown_compute_type = false;
}

// The PrecisionKind of a PrecisionPolicy type, from its compute type.
template <PrecisionPolicy P>
constexpr PrecisionKind precision_kind() {
    using A = typename P::compute_type;
    if constexpr (std::is_same_v<A, float>)
        return PrecisionKind::fp32;
    else if constexpr (std::is_same_v<A, bfloat16>)
        return PrecisionKind::bf16;
    else if constexpr (std::is_same_v<A, half>)
        return PrecisionKind::fp16;
    else
        static_assert(detail::unknown_compute_type<A>,
                      "snug::precision_kind: the planner knows float, bfloat16 and half compute types only");
}

// ---- what is predicted -------------------------------------------------------------

// One training configuration, as a trainer like examples/train_gpt builds it:
// a MemoryTracker; a cuBLASLt context on CUDA; GPT<Act, D>; token and target
// ids for the n micro-batches of an update, n·B·T int32 each, as workspace;
// TrainStep (AdamW, the gradient-norm scalar, the loss-scaler flag); two
// ActivationArenas (activations, and temporaries for backward). Training,
// evaluation at (B, T) and, when sampling_window > 0, sampling (a window of
// that many int32 ids in workspace, forward passes at (1, up to the window)
// without targets) all run with the same recompute modes.
struct MemoryPlanInput {
    GPTConfig model;
    PrecisionKind precision = PrecisionKind::fp32;
    int micro_batch = 1;                // B: sequences per forward
    int seq = 1;                        // T: tokens per sequence, at most model.max_seq_len
    int accumulation = 1;               // n: micro-batches per update
    std::vector<Recompute> recompute;   // one mode per block; empty: every block keeps everything
    std::size_t backend_workspace = 0;  // the cuBLASLt workspace on CUDA (cuda::Blas::workspace_bytes()); 0 on the host
    int sampling_window = 0;            // int32 ids of the trainer's sampling window (train_gpt: max_seq_len); 0: none

    // Throws ConfigError naming the first field that makes no sense.
    void validate() const {
        model.validate();
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

    // The modes in force: recompute, or all none when it is empty.
    std::vector<Recompute> modes() const {
        if (!recompute.empty()) return recompute;
        return std::vector<Recompute>(static_cast<std::size_t>(model.n_layer), Recompute::none);
    }
};

// What the tracker will report after training with a MemoryPlanInput.
struct MemoryPlan {
    MemoryBreakdown peak{};           // MemoryTracker::peak(c) per category
    std::size_t total = 0;            // MemoryTracker::peak_total()
    MemoryBreakdown at_total_peak{};  // MemoryTracker::peak_breakdown()
    std::string peak_moment;          // when the total peaks, e.g. "backward of block 0 (full)"

    std::size_t operator[](MemoryCategory c) const { return peak[static_cast<std::size_t>(c)]; }

    // A table: per category the predicted peak and its value at the total's
    // peak; then the total and when it is reached.
    std::string report() const {
        constexpr int name_width = 16;
        constexpr int column_width = 15;
        std::ostringstream out;
        out << std::left << std::setw(name_width) << "category" << std::right << std::setw(column_width) << "peak"
            << std::setw(column_width) << "at total peak" << '\n';
        for (MemoryCategory c : all_memory_categories) {
            const auto i = static_cast<std::size_t>(c);
            out << std::left << std::setw(name_width) << category_name(c) << std::right << std::setw(column_width)
                << format_bytes(peak[i]) << std::setw(column_width) << format_bytes(at_total_peak[i]) << '\n';
        }
        out << std::left << std::setw(name_width) << "total" << std::right << std::setw(column_width)
            << format_bytes(total) << std::setw(column_width) << format_bytes(total) << "  (" << total
            << " bytes, at the " << peak_moment << ")\n";
        return out.str();
    }
};

namespace detail {

// Where one pass is when a moment is visited.
enum class Phase : std::uint8_t { forward, head, head_backward, backward, embedding_backward };

inline std::string phase_text(Phase phase, int block, Recompute mode, bool sampling) {
    const std::string where = sampling ? "sampling " : "";
    const std::string b = "block " + std::to_string(block) + " (" + recompute_name(mode) + ")";
    switch (phase) {
        case Phase::forward: return where + "forward of " + b;
        case Phase::head: return where + "forward of the head (logits)";
        case Phase::head_backward: return "backward of the head";
        case Phase::backward: return "backward of " + b;
        case Phase::embedding_backward: return "backward of the embedding";
    }
    return "?";
}

// Calls f(activations, temporaries, phase, block) at every local maximum of
// the activation arena, the scratch arena and their sum during one GPT
// forward at (B, T) (with targets: the per-token losses for a moment) and,
// when `backward`, the backward that follows; in time order. It follows the
// pushes of GPT, LayerStack, checkpointed_forward/backward and
// TransformerBlock, as gpt_activation_peak does for the activations alone.
template <class F>
void gpt_pass_moments(const GPTConfig& c, int B, int T, std::span<const Recompute> modes, std::size_t act_bytes,
                      bool targets, bool backward, F&& f) {
    const std::size_t N = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    const std::size_t x = act_bytes * N * static_cast<std::size_t>(c.channels);  // one (B, T, C) tensor
    const std::size_t att = act_bytes * static_cast<std::size_t>(B) * static_cast<std::size_t>(c.n_head) *
                            static_cast<std::size_t>(T) * static_cast<std::size_t>(T);  // (B, NH, T, T)
    const std::size_t ln_stats = 2 * N * sizeof(float);  // one LayerNorm's mean and rstd
    const BlockActivationBytes block = gpt_block_activation_bytes(c, B, T, act_bytes);
    auto kept = [&](Recompute r) {
        return r == Recompute::none ? block.keep : r == Recompute::selective ? block.selective : std::size_t{0};
    };
    const int L = static_cast<int>(modes.size());

    // Forward: the embedding, then per block its output and what it keeps.
    std::size_t act = x;
    for (int i = 0; i < L; ++i) {
        const Recompute r = modes[static_cast<std::size_t>(i)];
        act += x;
        if (r == Recompute::selective) {
            // Dropped tensors live in scratch only while the next GEMM reads them.
            f(act + 3 * x, x + ln_stats, Phase::forward, i);  // ln1 in scratch, qkv kept
            f(act + 4 * x, att, Phase::forward, i);           // probabilities in scratch, attention output kept
            f(act + 9 * x, x + ln_stats, Phase::forward, i);  // ln2 in scratch, residual and MLP hidden kept
            f(act + 9 * x, 4 * x, Phase::forward, i);         // GELU in scratch
        } else {
            f(act + block.keep, 0, Phase::forward, i);        // a checkpointed block lets go right after
        }
        act += kept(r);
    }
    // The head: ln_f and its statistics, the logits, the losses for a moment.
    const std::size_t head = x + ln_stats + act_bytes * N * static_cast<std::size_t>(c.padded_vocab_size);
    f(act + head + (targets ? N * sizeof(float) : 0), 0, Phase::head, -1);
    if (!backward) return;

    // Backward: two (B, T, C) gradients for the whole pass, a third for ln_f
    // while the head is still there.
    f(act + head, 3 * x, Phase::head_backward, -1);
    const std::size_t grads = 2 * x;
    const std::size_t block_scratch = 9 * x + att;  // d hidden (4), d ln (1), d residual (1), d qkv (3), d probabilities
    for (int j = L - 1; j >= 0; --j) {
        const Recompute r = modes[static_cast<std::size_t>(j)];
        if (r == Recompute::full) {
            // The recomputed output and a plain forward's activations, then backward.
            f(act + x + block.keep, grads + block_scratch, Phase::backward, j);
        } else if (r == Recompute::selective) {
            // GELU, ln2 and the probabilities rebuilt; the attention output for a moment in scratch.
            f(act + 5 * x + ln_stats + att, grads + x, Phase::backward, j);
            f(act + block.recompute_selective, grads + block_scratch, Phase::backward, j);
        } else {
            f(act, grads + block_scratch, Phase::backward, j);
        }
        act -= kept(r) + x;
    }
    f(act, grads, Phase::embedding_backward, -1);
}

}  // namespace detail

// The peak of every category and of the total over training (updates of n
// micro-batches: forward, backward, unscale, gradient norm, AdamW),
// evaluation at (B, T), and sampling when the input has a window. Exact to
// the byte against the host tracker (tests/host/planner_test.cpp); on CUDA
// the driver also counts what the tracker does not see (context, arena
// chunks, allocation rounding).
inline MemoryPlan predict_memory(const MemoryPlanInput& in) {
    in.validate();
    const GPTConfig& c = in.model;
    const std::vector<Recompute> modes = in.modes();
    const std::size_t A = compute_bytes(in.precision);
    const auto P = static_cast<std::size_t>(c.num_parameters());
    const std::size_t B = static_cast<std::size_t>(in.micro_batch), T = static_cast<std::size_t>(in.seq);
    const std::size_t ids = static_cast<std::size_t>(in.accumulation) * B * T * sizeof(std::int32_t);
    const std::size_t window = static_cast<std::size_t>(in.sampling_window) * sizeof(std::int32_t);

    MemoryBreakdown held{};  // what lives from before the first update to the end
    auto at = [](MemoryBreakdown& m, MemoryCategory cat) -> std::size_t& { return m[static_cast<std::size_t>(cat)]; };
    at(held, MemoryCategory::parameters) = P * A;
    at(held, MemoryCategory::gradients) = P * sizeof(float);
    at(held, MemoryCategory::master_weights) = keeps_master_weights(in.precision) ? P * sizeof(float) : 0;
    at(held, MemoryCategory::optimizer_state) = 2 * P * sizeof(float);
    // cuBLASLt's workspace, the token and target ids, the gradient-norm scalar, the overflow flag.
    at(held, MemoryCategory::workspace) = in.backend_workspace + 2 * ids + 2 * sizeof(float);
    std::size_t held_total = 0;
    for (std::size_t v : held) held_total += v;

    MemoryPlan plan;
    plan.peak = held;
    plan.total = held_total;
    plan.at_total_peak = held;
    plan.peak_moment = "start";
    std::size_t act_peak = 0, tmp_peak = 0;
    bool sampling = false;
    std::size_t extra = 0;  // the sampling window while sampling
    auto visit = [&](std::size_t act, std::size_t tmp, detail::Phase phase, int block) {
        act_peak = std::max(act_peak, act);
        tmp_peak = std::max(tmp_peak, tmp);
        const std::size_t total = held_total + extra + act + tmp;
        if (total > plan.total) {  // the first moment to reach it, as the tracker records
            plan.total = total;
            plan.at_total_peak = held;
            at(plan.at_total_peak, MemoryCategory::workspace) += extra;
            at(plan.at_total_peak, MemoryCategory::activations) = act;
            at(plan.at_total_peak, MemoryCategory::temporaries) = tmp;
            plan.peak_moment = detail::phase_text(phase, block, block >= 0 ? modes[static_cast<std::size_t>(block)]
                                                                           : Recompute::none,
                                                  sampling);
        }
    };
    // Every micro-batch and every update repeats the first one's moments;
    // evaluation's forward repeats the training forward's.
    detail::gpt_pass_moments(c, in.micro_batch, in.seq, modes, A, true, true, visit);
    if (window > 0) {
        sampling = true;
        extra = window;
        detail::gpt_pass_moments(c, 1, in.sampling_window, modes, A, false, false, visit);
        at(plan.peak, MemoryCategory::workspace) += window;
    }
    // The activations' own account (gpt_memory.hpp); the walk above agrees with it.
    at(plan.peak, MemoryCategory::activations) =
        std::max(gpt_activation_peak(c, in.micro_batch, in.seq, modes, A), act_peak);
    at(plan.peak, MemoryCategory::temporaries) = tmp_peak;
    return plan;
}

// How much the total peak grows per extra sequence in the micro-batch (at the
// input's T, modes and accumulation): the activations and temporaries of one
// sequence at the peak moment, and its n token and target ids. Everything
// else is fixed, so total(B) = total(1) + (B - 1) · this.
inline std::size_t bytes_per_sequence(const MemoryPlanInput& in) {
    MemoryPlanInput one = in, two = in;
    one.micro_batch = 1;
    two.micro_batch = 2;
    return predict_memory(two).total - predict_memory(one).total;
}

// The largest micro-batch B whose predicted total fits `budget` (the input's
// T, modes and accumulation kept); 0 when even B = 1 does not fit.
inline int largest_micro_batch(const MemoryPlanInput& in, std::size_t budget) {
    MemoryPlanInput probe = in;
    auto fits = [&](int B) {
        probe.micro_batch = B;
        return predict_memory(probe).total <= budget;
    };
    if (!fits(1)) return 0;
    constexpr int cap = 1 << 24;
    int lo = 1;  // fits
    int hi = 2;  // to be tested
    while (hi <= cap && fits(hi)) {
        lo = hi;
        hi *= 2;
    }
    if (hi > cap) return lo;
    while (hi - lo > 1) {  // lo fits, hi does not
        const int mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
    }
    return lo;
}

// ---- checkpoint policies -------------------------------------------------------------

// The modes `policy` picks for a GPT at (B, T), asked exactly as TrainStep
// asks it (the same CheckpointQuery), so checkpoint::Budget gives the plan
// training will use.
template <CheckpointPolicy Policy>
std::vector<Recompute> plan_recompute(const Policy& policy, const GPTConfig& c, PrecisionKind precision, int B,
                                      int T) {
    const std::size_t A = compute_bytes(precision);
    CheckpointQuery query{c.n_layer, [&](std::span<const Recompute> modes) {
                              return gpt_activation_peak(c, B, T, modes, A);
                          }};
    query.selective_available = true;  // GPT's blocks recompute selectively (GPT::supports_selective)
    return policy.plan(query);
}

// A policy as train_gpt's --checkpoint writes it: none, full, selective,
// every:K, budget.
template <CheckpointPolicy Policy>
std::string checkpoint_label(const Policy&) {
    if constexpr (requires { Policy::k; })
        return "every:" + std::to_string(Policy::k);
    else
        return Policy::name;
}

namespace detail {
// EveryNth<K>'s plan for a K known at run time, K in [1, max_every].
inline constexpr int max_every = 16;
template <int... K>
std::vector<Recompute> every_nth_plan(int k, const CheckpointQuery& q, std::integer_sequence<int, K...>) {
    std::vector<Recompute> modes;
    (void)((k == K + 1 ? (modes = checkpoint::EveryNth<K + 1>{}.plan(q), true) : false) || ...);
    return modes;
}
}  // namespace detail

// The modes of a policy named as train_gpt's --checkpoint names it — none,
// full, selective, every:K (K from 1 to 16) — for `blocks` blocks, from the
// policy's own plan(). "auto" (checkpoint::Budget) depends on the shape and a
// byte budget: use plan_recompute(checkpoint::Budget(bytes), ...). Anything
// else throws ConfigError naming it.
inline std::vector<Recompute> recompute_plan_for(std::string_view checkpoint, int blocks) {
    const CheckpointQuery q{blocks, [](std::span<const Recompute>) { return std::size_t{0}; }};
    if (checkpoint == "none") return checkpoint::None{}.plan(q);
    if (checkpoint == "full") return checkpoint::Full{}.plan(q);
    if (checkpoint == "selective") return checkpoint::Selective{}.plan(q);
    if (checkpoint.substr(0, 6) == "every:") {
        const std::string digits(checkpoint.substr(6));
        int k = 0;
        bool ok = !digits.empty() && digits.size() <= 2;
        for (char ch : digits) {
            ok = ok && ch >= '0' && ch <= '9';
            k = k * 10 + (ch - '0');
        }
        if (ok && k >= 1 && k <= detail::max_every)
            return detail::every_nth_plan(k, q, std::make_integer_sequence<int, detail::max_every>{});
    }
    throw ConfigError("checkpoint '" + std::string(checkpoint) + "': expected none, full, selective or every:K with K "
                      "from 1 to " + std::to_string(detail::max_every) +
                      " (auto depends on a byte budget: plan it with checkpoint::Budget)");
}

// A policy the --plan search may choose, with its modes for one model.
struct CheckpointCandidate {
    std::string name;  // as checkpoint_label writes it
    std::vector<Recompute> recompute;
};

// The candidates of the --plan search, cheapest first. "Cheapest" is the
// compute recomputation adds (train/metrics.hpp's hardware FLOPs): none adds
// nothing; selective re-runs attention's QKᵀ and AV (4·C·T per token and
// block) plus element-wise work, no weight GEMM; every:4, every:3, every:2
// re-run a whole block forward (2·(12 C² + 13 C) + 4 C T) for a quarter, a
// third, half the blocks; full for all of them, a third more work per step.
// Selective before every:4 holds while 4·C·T·L < (L/4)·(24 C² + 4 C T), that is
// T < 2 C (GPT-2 small: 1024 < 1536), which is where these models train; at
// longer contexts the attention part grows and selective costs more.
inline std::vector<CheckpointCandidate> checkpoint_candidates(const GPTConfig& c, PrecisionKind precision, int B,
                                                              int T) {
    std::vector<CheckpointCandidate> out;
    auto add = [&](const auto& policy) {
        out.push_back({checkpoint_label(policy), plan_recompute(policy, c, precision, B, T)});
    };
    add(checkpoint::None{});
    add(checkpoint::Selective{});
    add(checkpoint::EveryNth<4>{});
    add(checkpoint::EveryNth<3>{});
    add(checkpoint::EveryNth<2>{});
    add(checkpoint::Full{});
    return out;
}

// --checkpoint auto: the activation byte budget to give checkpoint::Budget so
// that the plan it picks at the input's (B, T) fits `budget` in total
// (activations, temporaries and everything else). Of the plans Budget tries
// (in its own order of growing recompute), the first whose choice fits wins.
// The input's recompute is ignored. Nothing fits: OutOfMemory, naming the
// budget and the smallest total any plan reaches.
inline std::size_t activation_budget(const MemoryPlanInput& in, std::size_t budget) {
    in.validate();
    const GPTConfig& c = in.model;
    const std::size_t A = compute_bytes(in.precision);
    // Budget's candidates in its order: with a budget of 0 it asks about each, then gives up.
    std::vector<std::vector<Recompute>> tried;
    CheckpointQuery recorder{c.n_layer, [&](std::span<const Recompute> modes) {
                                 tried.emplace_back(modes.begin(), modes.end());
                                 return gpt_activation_peak(c, in.micro_batch, in.seq, modes, A);
                             }};
    try {
        (void)checkpoint::Budget(0).plan(recorder);
    } catch (const OutOfMemory&) {
        // expected: no plan keeps 0 bytes
    }
    MemoryPlanInput probe = in;
    std::size_t smallest = static_cast<std::size_t>(-1);
    for (const std::vector<Recompute>& modes : tried) {
        const std::size_t activation_bytes = gpt_activation_peak(c, in.micro_batch, in.seq, modes, A);
        probe.recompute = plan_recompute(checkpoint::Budget(activation_bytes), c, in.precision, in.micro_batch, in.seq);
        const std::size_t total = predict_memory(probe).total;
        if (total <= budget) return activation_bytes;
        smallest = std::min(smallest, total);
    }
    throw OutOfMemory("checkpoint auto: no recompute plan fits the budget of " + format_bytes(budget) + " (" +
                      std::to_string(budget) + " bytes) at micro-batch " + std::to_string(in.micro_batch) +
                      " x " + std::to_string(in.seq) + "; the smallest predicted peak of any plan is " +
                      format_bytes(smallest) + ": use a smaller micro-batch or a shorter context");
}

// ---- the --plan search --------------------------------------------------------------

// How far one checkpoint policy got in plan_for_budget.
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

    // The choice and why, in a few lines, then the chosen plan's table.
    std::string report() const {
        std::ostringstream out;
        out << "plan for a budget of " << format_bytes(budget) << " (" << budget << " bytes), " << wanted_batch
            << " sequences of " << seq << " tokens per update:\n";
        for (const PolicyTry& t : tried) {
            out << "  checkpoint " << t.checkpoint << ": ";
            if (t.micro_batch == 0)
                out << "even micro-batch 1 needs " << format_bytes(t.bytes) << ", "
                    << format_bytes(t.bytes - budget) << " over the budget\n";
            else
                out << "micro-batch " << t.micro_batch << " fits (" << format_bytes(t.bytes) << ")\n";
        }
        if (!fits) {
            out << "nothing fits: even full checkpointing at micro-batch 1 is over the budget\n";
            return out.str();
        }
        out << "choice: micro-batch " << micro_batch << " x accumulation " << accumulation << ", checkpoint "
            << checkpoint << ", predicted peak " << format_bytes(memory.total);
        if (next_micro_batch)
            out << " (micro-batch " << *next_micro_batch << " would need " << format_bytes(*next_micro_batch_bytes)
                << ")";
        out << "\n";
        if (tried.size() > 1)
            out << "why: the cheaper checkpoint " << tried[tried.size() - 2].checkpoint
                << " does not fit even micro-batch 1\n";
        out << memory.report();
        return out.str();
    }
};

// The --plan search. From `base` it takes the model, precision, seq, backend
// workspace and sampling window (micro_batch, accumulation and recompute are
// chosen here). For each checkpoint policy from the cheapest
// (checkpoint_candidates' order) it finds the largest micro-batch B that
// divides wanted_batch and fits `budget` (accumulation = wanted_batch / B:
// accumulate only what does not fit); the first policy with any B wins:
// checkpoint only when even B = 1 does not fit without it.
inline BudgetPlan plan_for_budget(const MemoryPlanInput& base, int wanted_batch, std::size_t budget) {
    if (wanted_batch < 1)
        throw ConfigError("plan_for_budget: the wanted batch must be at least 1 sequence, got " +
                          std::to_string(wanted_batch));
    BudgetPlan plan;
    plan.budget = budget;
    plan.wanted_batch = wanted_batch;
    plan.seq = base.seq;
    std::vector<int> divisors;  // largest first
    for (int b = wanted_batch; b >= 1; --b)
        if (wanted_batch % b == 0) divisors.push_back(b);
    for (const CheckpointCandidate& candidate : checkpoint_candidates(base.model, base.precision, 1, base.seq)) {
        MemoryPlanInput probe = base;
        probe.recompute = candidate.recompute;
        PolicyTry t{candidate.name, 0, 0};
        for (std::size_t i = 0; i < divisors.size(); ++i) {
            probe.micro_batch = divisors[i];
            probe.accumulation = wanted_batch / divisors[i];
            const MemoryPlan m = predict_memory(probe);
            if (m.total > budget) {
                if (i + 1 == divisors.size()) t.bytes = m.total;  // micro-batch 1
                continue;
            }
            t.micro_batch = divisors[i];
            t.bytes = m.total;
            plan.fits = true;
            plan.checkpoint = candidate.name;
            plan.recompute = candidate.recompute;
            plan.micro_batch = divisors[i];
            plan.accumulation = probe.accumulation;
            plan.memory = m;
            if (i > 0) {
                MemoryPlanInput next = probe;
                next.micro_batch = divisors[i - 1];
                next.accumulation = wanted_batch / divisors[i - 1];
                plan.next_micro_batch = divisors[i - 1];
                plan.next_micro_batch_bytes = predict_memory(next).total;
            }
            break;
        }
        plan.tried.push_back(t);
        if (plan.fits) break;
    }
    return plan;
}

// ---- the largest model -----------------------------------------------------------------

// A shape family: the model of each depth.
using ModelFamily = std::function<GPTConfig(int depth)>;

// llm.c's and snug's "dN" family: L = d blocks, C = 64 d channels, NH = d heads
// (head size 64); vocabulary and context from `like`.
inline ModelFamily gpt_depth_family(const GPTConfig& like) {
    return [like](int depth) {
        GPTConfig c = like;
        c.n_layer = depth;
        c.n_head = depth;
        c.channels = 64 * depth;
        return c;
    };
}

// The largest model of a family that fits.
struct ModelFit {
    int depth = 0;                // 0: not even depth 1 fits
    GPTConfig model;
    std::size_t budget = 0;
    std::string checkpoint;       // the cheapest policy that fits at this depth
    std::vector<Recompute> recompute;
    MemoryPlan memory;
    std::size_t next_depth_bytes = 0;  // the least any policy needs one block deeper

    std::string report() const {
        std::ostringstream out;
        out << "largest model for a budget of " << format_bytes(budget) << " (" << budget << " bytes): ";
        if (depth == 0) {
            out << "none; depth 1 needs at least " << format_bytes(next_depth_bytes) << "\n";
            return out.str();
        }
        out << "depth " << depth << " (" << model.n_layer << " layers, " << model.n_head << " heads, "
            << model.channels << " channels, " << model.num_parameters() << " parameters), checkpoint "
            << checkpoint << ", predicted peak " << format_bytes(memory.total) << "; depth " << depth + 1
            << " needs at least " << format_bytes(next_depth_bytes) << "\n";
        return out.str();
    }
};

// The deepest model of `family` (memory growing with depth) that trains at
// micro-batch 1 within `budget` under some checkpoint policy, full
// checkpointing included, and the cheapest policy that fits at that depth.
// From `base`: precision, seq, accumulation, backend workspace, sampling
// window. Depths are tried from 1 up to max_depth.
inline ModelFit largest_model_that_fits(const ModelFamily& family, const MemoryPlanInput& base, std::size_t budget,
                                        int max_depth = 1024) {
    ModelFit fit;
    fit.budget = budget;
    for (int depth = 1; depth <= max_depth; ++depth) {
        MemoryPlanInput probe = base;
        probe.model = family(depth);
        probe.micro_batch = 1;
        bool found = false;
        std::size_t least = static_cast<std::size_t>(-1);
        for (const CheckpointCandidate& candidate : checkpoint_candidates(probe.model, base.precision, 1, base.seq)) {
            probe.recompute = candidate.recompute;
            const MemoryPlan m = predict_memory(probe);
            least = std::min(least, m.total);
            if (!found && m.total <= budget) {
                found = true;
                fit.depth = depth;
                fit.model = probe.model;
                fit.checkpoint = candidate.name;
                fit.recompute = candidate.recompute;
                fit.memory = m;
            }
        }
        if (!found) {
            fit.next_depth_bytes = least;
            break;
        }
    }
    return fit;
}

// What train_gpt prints before training: the predicted peak, memory per
// sequence, and (with a budget) the largest micro-batch that fits.
inline std::string memory_forecast(const MemoryPlanInput& in, std::optional<std::size_t> budget) {
    const MemoryPlan plan = predict_memory(in);
    std::ostringstream out;
    out << "predicted memory peak " << format_bytes(plan.total) << " at the " << plan.peak_moment
        << "; memory per sequence " << format_bytes(bytes_per_sequence(in)) << " (T = " << in.seq << ")";
    if (budget) {
        const int b = largest_micro_batch(in, *budget);
        out << "; largest micro-batch for the " << format_bytes(*budget) << " budget: ";
        if (b == 0) {
            MemoryPlanInput one = in;
            one.micro_batch = 1;
            out << "none (micro-batch 1 needs " << format_bytes(predict_memory(one).total) << ")";
        } else {
            out << b;
        }
    }
    out << "\n";
    return out.str();
}

}  // namespace snug
