// The text a training program prints, formatted with fmt: every Report event
// (snug/train/report.hpp) as a terminal shows it — the run's header lines, the
// progress display (one live line on a terminal, plain lines in a log), the
// summary table, the memory planner's tables, --plan's answer and the VRAM
// ladder's table. The formatting functions are free so that tests and other
// reports can use them; TextReport puts them on a FILE*.
//
// Host code only: nvcc cannot compile Debian's fmt 9.1. A CUDA program builds
// its TextReport in a file g++ compiles and hands the engine a Report&
// (examples/train_gpt/report.cpp).
#pragma once

#if defined(__CUDACC__)
#error "snug/report/text_report.hpp formats with fmt, which nvcc cannot compile: include it from a .cpp the host compiler builds (see examples/train_gpt/report.cpp)"
#endif

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "snug/core/bytes.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/train/report.hpp"

namespace snug {

// ---- pieces -------------------------------------------------------------------

// "12.3%" or "unknown peak".
inline std::string format_utilisation(const std::optional<double>& u) {
    return u ? fmt::format("{:.1f}%", 100.0 * *u) : std::string("unknown peak");
}

// A loss with four decimals, or "n/a".
inline std::string format_loss(const std::optional<double>& v) {
    return v ? fmt::format("{:.4f}", *v) : std::string("n/a");
}

// "val loss 2.3456 nats (floor 2.1000)"
inline std::string format_val_loss(double loss, std::optional<double> floor) {
    return floor ? fmt::format("val loss {:.4f} nats (floor {:.4f})", loss, *floor)
                 : fmt::format("val loss {:.4f} nats", loss);
}

// Bytes as MiB with one decimal, the ladder table's unit.
inline std::string format_mib(std::size_t bytes) { return fmt::format("{:.1f}", static_cast<double>(bytes) / 1048576.0); }

// ---- a run ----------------------------------------------------------------------

// One line for the progress display:
// "step   12/300  loss 2.3456  lr 1.20e-03  norm 0.812  1234 tok/s  MFU 41.2%  peak 12.3 MiB"
// The MFU column is left out where the device's peak is unknown (the host):
// a reader should never see "unknown" where a result belongs.
inline std::string progress_line(const StepRecord& r, std::int64_t total_steps) {
    const std::size_t width = std::to_string(total_steps).size();
    std::string line = fmt::format("step {:>{}}/{}  loss {:.4f}  lr {:.2e}  norm {:.3f}", r.step, width, total_steps,
                                   r.train_loss, r.lr, r.grad_norm);
    auto out = std::back_inserter(line);
    if (r.loss_scale != 1.0) fmt::format_to(out, "  scale {:g}", r.loss_scale);
    if (r.skipped) line += "  SKIPPED (non-finite gradient)";
    fmt::format_to(out, "  {:.0f} tok/s", r.tokens_per_second());
    if (const auto mfu = r.mfu()) fmt::format_to(out, "  MFU {}", format_utilisation(mfu));
    fmt::format_to(out, "  peak {}", format_bytes(r.peak_total));
    return line;
}

// The end-of-run summary as a table, one quantity per line.
inline std::string render_summary(const RunSummary& s) {
    std::string out = "summary\n";
    const auto row = [&](std::string_view name, const std::string& value) {
        fmt::format_to(std::back_inserter(out), "  {:<24}{}\n", name, value);
    };
    row("updates", fmt::format("{} ({} tokens)", s.steps, s.tokens));
    row("wall-clock", fmt::format("{:.1f} s", s.wall_clock));
    row("median tokens/s",
        s.median_tokens_per_second ? fmt::format("{:.0f}", *s.median_tokens_per_second) : std::string("n/a"));
    if (s.median_mfu) row("median MFU", format_utilisation(s.median_mfu));  // no row without a known peak
    row("final train loss", format_loss(s.final_train_loss));
    std::string val = format_loss(s.final_val_loss);
    if (s.first_val_loss) val += fmt::format(" (first {})", format_loss(s.first_val_loss));
    if (s.loss_floor) val += fmt::format(", floor {}", format_loss(s.loss_floor));
    row("final val loss", val);
    row("loss at equal FLOPs",
        fmt::format("{} at {:.3e} model FLOPs", format_loss(s.loss_at_equal_flops), s.flops_budget) +
            (s.loss_at_equal_flops ? "" : fmt::format(" (run total {:.3e})", s.total_model_flops)));
    row("peak memory", fmt::format("{} ({} bytes)", format_bytes(s.peak_total), s.peak_total));
    for (MemoryCategory c : all_memory_categories)
        row(fmt::format("  {}", category_name(c)), format_bytes(s.peak_bytes[static_cast<std::size_t>(c)]));
    if (s.host_peak > 0) row("host memory (offload)", fmt::format("{} ({} bytes)", format_bytes(s.host_peak), s.host_peak));
    return out;
}

// ---- the memory planner ---------------------------------------------------------

// Per category the predicted peak and its value at the total's peak; then
// the total and when it is reached, and what the device reserves.
inline std::string format_memory_plan(const MemoryPlan& p) {
    std::string out = fmt::format("{:<16}{:>15}{:>15}\n", "category", "peak", "at total peak");
    auto it = std::back_inserter(out);
    for (MemoryCategory c : all_memory_categories) {
        const auto i = static_cast<std::size_t>(c);
        fmt::format_to(it, "{:<16}{:>15}{:>15}\n", category_name(c), format_bytes(p.peak[i]),
                       format_bytes(p.at_total_peak[i]));
    }
    fmt::format_to(it, "{:<16}{:>15}{:>15}  ({} bytes; {})\n", "total", format_bytes(p.total), format_bytes(p.total),
                   p.total, p.peak_moment);
    fmt::format_to(it, "{:<16}{:>15}{:>15}  (allocations as the device rounds them, arena chunks whole, context)\n",
                   "device reserves", format_bytes(p.reserved), "");
    if (p.host > 0)
        fmt::format_to(it, "{:<16}{:>15}{:>15}  (the offloaded optimizer: its state, a copy of the weights, gradient "
                           "chunks in flight; no device budget counts it)\n",
                       "host memory", format_bytes(p.host), "");
    return out;
}

// Before a run: the predicted peak, memory per sequence, the largest micro-batch.
inline std::string format_outlook(const MemoryOutlook& o) {
    std::string out = fmt::format("predicted memory peak {} ({}); memory per sequence {} (T = {})",
                                  format_bytes(o.plan.required), o.plan.peak_moment, format_bytes(o.bytes_per_sequence),
                                  o.seq);
    if (o.budget) {
        out += fmt::format("; largest micro-batch for the {} budget: ", format_bytes(*o.budget));
        out += o.largest_micro_batch > 0
                   ? std::to_string(o.largest_micro_batch)
                   : fmt::format("none (micro-batch 1 needs {})", format_bytes(o.micro_batch_1_bytes));
    }
    return out + "\n";
}

// The fastest configuration for a budget: the policies tried, the choice and
// why, then the chosen plan's table.
inline std::string format_budget_plan(const BudgetPlan& p) {
    std::string out = fmt::format("plan for a budget of {} ({} bytes), {} sequences of {} tokens per update:\n",
                                  format_bytes(p.budget), p.budget, p.wanted_batch, p.seq);
    auto it = std::back_inserter(out);
    for (const PolicyTry& t : p.tried) {
        if (t.micro_batch == 0)
            fmt::format_to(it, "  checkpoint {}: even micro-batch 1 needs {}, {} over the budget\n", t.checkpoint,
                           format_bytes(t.bytes), format_bytes(t.bytes - p.budget));
        else
            fmt::format_to(it, "  checkpoint {}: micro-batch {} fits ({})\n", t.checkpoint, t.micro_batch,
                           format_bytes(t.bytes));
    }
    if (!p.fits) return out + "nothing fits: even full checkpointing at micro-batch 1 is over the budget\n";
    fmt::format_to(it, "choice: micro-batch {} x accumulation {}, checkpoint {}, predicted peak {}", p.micro_batch,
                   p.accumulation, p.checkpoint, format_bytes(p.memory.required));
    if (p.next_micro_batch)
        fmt::format_to(it, " (micro-batch {} would need {})", *p.next_micro_batch,
                       format_bytes(p.next_micro_batch_bytes.value_or(0)));
    out += "\n";
    if (p.tried.size() > 1)
        fmt::format_to(it, "why: the cheaper checkpoint {} does not fit even micro-batch 1\n",
                       p.tried[p.tried.size() - 2].checkpoint);
    return out + format_memory_plan(p.memory);
}

// "gpt2, 12 layers, 12 heads, 768 channels": the family (where it has a
// name) and the shape, heads where the family's blocks say them ("8 heads
// (2 key/value)" with grouped-query attention).
inline std::string format_model_shape(const ModelSummary& m) {
    std::string s = m.family.empty() ? "" : m.family + ", ";
    s += fmt::format("{} layers, ", m.layers);
    if (m.heads > 0 && m.kv_heads > 0 && m.kv_heads != m.heads)
        s += fmt::format("{} heads ({} key/value), ", m.heads, m.kv_heads);
    else if (m.heads > 0)
        s += fmt::format("{} heads, ", m.heads);
    return s + fmt::format("{} channels", m.channels);
}

// ", flash attention": how the model's attention computes (nothing for a
// family whose blocks have no heads).
inline std::string format_attention(const ModelSummary& m) {
    return m.heads > 0 ? fmt::format(", {} attention", attention_kind_name(m.attention)) : std::string();
}

// The largest model of a family that fits, in one line.
inline std::string format_model_fit(const ModelFit& f) {
    std::string out = fmt::format("largest model for a budget of {} ({} bytes): ", format_bytes(f.budget), f.budget);
    if (f.depth == 0) return out + fmt::format("none; depth 1 needs at least {}\n", format_bytes(f.next_depth_bytes));
    ModelSummary shape = f.model;
    shape.family.clear();
    out += fmt::format("depth {} ({}, {} parameters), checkpoint {}, predicted peak {}; ", f.depth,
                       format_model_shape(shape), f.model.parameters, f.checkpoint, format_bytes(f.memory.required));
    if (f.at_limit) return out + "the search stops at this depth\n";
    return out + fmt::format("depth {} needs at least {}\n", f.depth + 1, format_bytes(f.next_depth_bytes));
}

// ---- the ladder -----------------------------------------------------------------

// The ladder's table: one row per rung, then what F is, the rule, the
// driver's figures on a GPU and each rung's note.
inline std::string format_ladder_table(const LadderTable& t, const std::vector<LadderRung>& rungs) {
    ModelSummary shape = t.model;
    shape.family.clear();
    std::string out = fmt::format("VRAM ladder: {}, T {}, {} sequences per update, {} updates; budget {}; {}\n",
                                  format_model_shape(shape), t.seq, t.sequences_per_update, t.updates,
                                  t.budget ? format_bytes(*t.budget) : std::string("none"), t.device);
    auto it = std::back_inserter(out);
    constexpr std::string_view row = "{:<24} {:<5} {:>8} {:>5} {:<10} {:>10} {:>10} {:<5} {:>10} {:>10} {:>10} {:>9} {:>9}\n";
    fmt::format_to(it, row, "rung", "prec", "B x n", "T", "ckpt", "peak MiB", "pred MiB", "fits", "tokens/s", "loss@F",
                   "mean loss", "val loss", "wall s");
    const auto four = [](const std::optional<double>& v) { return v ? fmt::format("{:.4f}", *v) : std::string("-"); };
    for (const LadderRung& r : rungs) {
        const RunSpec& run = r.options.run;
        const RunSummary& s = r.result.summary;
        fmt::format_to(it, row, r.name, run.precision_name(), fmt::format("{}x{}", run.micro_batch, run.accumulation),
                       run.seq, run.checkpoint_name(), r.ran ? format_mib(r.result.peak_total) : "-",
                       format_mib(r.predicted.total), !r.needed ? "-" : r.fits ? "yes" : "NO",
                       r.ran ? fmt::format("{:.0f}", s.median_tokens_per_second.value_or(0.0)) : "-",
                       four(r.loss_at_equal_flops), four(r.mean_loss_over_flops),
                       r.ran ? four(s.final_val_loss) : "-", r.ran ? fmt::format("{:.1f}", s.wall_clock) : "-");
    }
    fmt::format_to(it, "F = {:.3g} model FLOPs (loss@F: training loss there; mean loss: the area under loss vs FLOPs "
                       "up to F, / F)\n{}\n",
                   t.common_flops, t.rule);
    // On a GPU: what the planner says the card reserves (less its context
    // estimate: the driver's figure is counted from after the context)
    // against what the driver gave each run.
    for (const LadderRung& r : rungs)
        if (r.ran && r.result.driver_peak > 0) {
            const std::size_t planned = r.predicted.reserved - r.predicted.context;
            fmt::format_to(it, "  {:<24} driver {} MiB, planner {} MiB ({:+.1f}%)\n", r.name,
                           format_mib(r.result.driver_peak), format_mib(planned),
                           100.0 * (static_cast<double>(planned) / static_cast<double>(r.result.driver_peak) - 1.0));
        }
    for (const LadderRung& r : rungs)
        if (!r.note.empty()) fmt::format_to(it, "  {}: {}\n", r.name, r.note);
    return out;
}

// ---- the display ------------------------------------------------------------------

// Where progress goes: on a terminal one line rewritten in place; elsewhere
// (a pipe, a log file) plain lines, every `plain_every`-th update only.
class ProgressDisplay {
public:
    ProgressDisplay(std::FILE* out, bool live, std::int64_t plain_every = 1)
        : out_(out), live_(live), plain_every_(std::max<std::int64_t>(plain_every, 1)) {}

    bool live() const { return live_; }
    void set_plain_every(std::int64_t n) { plain_every_ = std::max<std::int64_t>(n, 1); }

    // The newest update's line (shown in place, or printed if on the interval).
    void update(std::int64_t step, const std::string& line) {
        if (live_) {
            fmt::print(out_, "\r{}\x1b[K", line);
            showing_ = true;
        } else if (step % plain_every_ == 0 || step == 1) {
            fmt::print(out_, "{}\n", line);
        }
        std::fflush(out_);
    }

    // Text that stays (an evaluation, a message, a table), above the live
    // line; a line break is added where the text has none at its end.
    void print(std::string_view text) {
        finish();
        fmt::print(out_, "{}{}", text, text.empty() || text.back() != '\n' ? "\n" : "");
        std::fflush(out_);
    }

    // Ends the live line so what follows starts on a fresh one.
    void finish() {
        if (showing_) std::fputc('\n', out_);
        showing_ = false;
        std::fflush(out_);
    }

private:
    std::FILE* out_;
    bool live_;
    std::int64_t plain_every_;
    bool showing_ = false;
};

// ---- the report -------------------------------------------------------------------

// Every event as text on `out` (errors, such as a diverging loss, on `err`).
// Progress is one live line when `out` is a terminal, else every twentieth
// update as a plain line.
class TextReport : public Report {
public:
    explicit TextReport(std::FILE* out = stdout, std::FILE* err = stderr)
        : out_(out), err_(err), display_(out, ::isatty(::fileno(out)) != 0) {}
    ~TextReport() override { display_.finish(); }

    void device(const DeviceInfo& d) override { line(fmt::format("device: {}", d.description)); }
    void model(const ModelSummary& m, int seq, const std::string& source) override {
        line(fmt::format("model: {}, context {}, vocab {}{}: {:.2f}M parameters, {:.3g} FLOPs/token; {}",
                         format_model_shape(m), m.context, m.vocab, format_attention(m),
                         static_cast<double>(m.parameters) / 1e6, m.flops_per_token(seq), source));
    }
    void data(const TrainData& d) override { line(fmt::format("data: {}", d.description)); }
    void attention(const std::string& path) override { line(fmt::format("attention: {}", path)); }
    void training_setup(const TrainOptions& o) override {
        line(fmt::format("precision {}, checkpoint {}, micro-batch {} x {}, {} per update: {} tokens/update, {} updates",
                         o.run.precision_name(), o.run.checkpoint_name(), o.run.micro_batch, o.run.seq,
                         o.run.accumulation, o.run.tokens_per_update(), o.steps));
        line(o.run.optimizer_name());
        line(fmt::format("lr {:.3g} (warmup {}, cosine to {:.3g} x), weight decay {:.3g}, clip {:.3g}; memory budget {}",
                         o.lr, o.warmup, o.min_lr_frac, o.weight_decay, o.clip,
                         o.budget_bytes ? format_bytes(*o.budget_bytes) : std::string("none")));
    }
    void data_parallel(int ranks, const std::string& how, int micro_batch, std::int64_t tokens, bool zero1) override {
        line(fmt::format("data parallel: {} ranks over {}, micro-batch {} each ({} sequences a micro-step), "
                         "{} tokens/update in all; rank 0 reports and writes the files",
                         ranks, how, micro_batch, ranks * micro_batch, tokens));
        if (zero1)
            line(fmt::format("ZeRO-1: each rank keeps 1/{} of the optimizer's state (the memory figures are rank 0's)",
                             ranks));
    }
    void memory_outlook(const MemoryOutlook& o) override { line(format_outlook(o)); }
    void plan(const PlanAnswer& p) override {
        line(fmt::format("device: {}; budget {}", p.device.description, format_bytes(p.budget)));
        line(fmt::format("model: {}, context {}, vocab {} ({:.2f}M parameters), {}{}, {}", format_model_shape(p.model),
                         p.model.context, p.model.vocab, static_cast<double>(p.model.parameters) / 1e6,
                         p.run.precision_name(), format_attention(p.model), p.run.optimizer_name()));
        line(fmt::format("\nas asked (micro-batch {} x {}, checkpoint {}):\n{}{}", p.run.micro_batch, p.run.accumulation,
                         p.run.checkpoint_name(), format_outlook(p.asked), format_memory_plan(p.asked.plan)));
        line(fmt::format("\nfastest configuration for {} sequences of {} tokens per update:\n{}", p.fastest.wanted_batch,
                         p.run.seq, format_budget_plan(p.fastest)));
        if (p.lean && p.lean_run)
            line(fmt::format("\nwith lean optimizer state ({}: {}):\n{}", p.lean_run->optimizer_name(),
                             p.lean_run->optimizer_flags(), format_budget_plan(*p.lean)));
        if (p.offloaded && p.offload_run)
            line(fmt::format("\nwith the optimizer offloaded to the host ({}: {}):\n{}", p.offload_run->optimizer_name(),
                             p.offload_run->optimizer_flags(), format_budget_plan(*p.offloaded)));
        if (p.zero && p.zero_run)
            line(fmt::format("\n{} ({}: {}), per rank:\n{}",
                             p.zero->fits ? fmt::format("on {} data-parallel ranks", p.zero_run->zero_ranks)
                                          : fmt::format("not even on {} data-parallel ranks", p.zero_run->zero_ranks),
                             p.zero_run->optimizer_name(), p.zero_run->optimizer_flags(), format_budget_plan(*p.zero)));
        line(fmt::format("\nlargest model of the family ({}) that fits at micro-batch 1:\n{}",
                         p.model.family == "gpt2" ? "L = d, C = 64 d, NH = d" : "d blocks of this shape",
                         format_model_fit(p.largest)));
    }

    void activation_budget(std::optional<std::size_t> bytes) override {
        line(bytes ? fmt::format("checkpoint auto: the first plan that fits the budget keeps {} of activations",
                                 format_bytes(*bytes))
                   : std::string("checkpoint auto: no memory budget, every activation kept"));
    }
    void resumed(const std::string& path, std::int64_t step, double wall) override {
        line(fmt::format("resumed from {} at update {} ({:.1f} s of training so far)", path, step, wall));
    }
    void recompute_plan(std::span<const Recompute> plan) override {
        line(fmt::format("recompute plan: {}", describe_plan(plan)));
    }
    void evaluation(std::int64_t step, double loss, std::optional<double> floor) override {
        line(fmt::format("step {}: {}", step, format_val_loss(loss, floor)));
    }
    void progress(const StepRecord& r, std::int64_t total_steps) override {
        display_.set_plain_every(total_steps / 20);
        display_.update(r.step, progress_line(r, total_steps));
    }
    void diverged(std::int64_t step, double loss) override {
        display_.finish();
        fmt::print(err_, "the training loss is {} at update {}; stopping (try a lower --lr)\n", loss, step);
    }
    void stopped(std::int64_t step, bool signalled, const std::string& state_path) override {
        line(fmt::format("stopped {} after update {}; {}", signalled ? "by a signal" : "as asked (--stop-after)", step,
                         state_path.empty() ? std::string("no state saved (no --out)")
                                            : fmt::format("state saved to {} (continue with --resume {})", state_path,
                                                          state_path)));
    }
    void summary(const RunSummary& s, std::int64_t skipped) override {
        std::string text = "\n";
        text += render_summary(s);
        if (skipped > 0) text += fmt::format("  {:<24}{} (non-finite gradients)\n", "skipped updates", skipped);
        line(text);
    }
    void file_written(std::string_view what, const std::string& where) override { line(fmt::format("{}: {}", what, where)); }
    void sample(const Sample& s) override {
        line(fmt::format("\nsample (temperature {:.2f}, top-k {}), prompt \"{}\":\n{}", s.temperature,
                         s.top_k > 0 ? std::to_string(s.top_k) : std::string("all"), s.prompt, s.text));
    }
    void evaluated(const Evaluation& e) override {
        std::string text = fmt::format("eval: loss {:.4f} nats (perplexity {:.2f}) over {} tokens ({} windows of {} x {})",
                                       e.loss, std::exp(e.loss), e.windows * e.micro_batch * e.seq, e.windows,
                                       e.micro_batch, e.seq);
        if (e.floor) text += fmt::format(", floor {:.4f}", *e.floor);
        line(text + fmt::format("; peak memory {}", format_bytes(e.peak_bytes)));
    }

    void rung_started(const LadderRung& r) override {
        const RunSpec& run = r.options.run;
        display_.finish();
        fmt::print(out_, "ladder: rung {:<22} {:<4} B {:>3} x {:<3} T {:>4} checkpoint {:<9} predicted peak {} MiB ...",
                   r.name, run.precision_name(), run.micro_batch, run.accumulation, run.seq, run.checkpoint_name(),
                   format_mib(r.predicted.required));
        std::fflush(out_);
    }
    void rung_finished(const LadderRung& r) override {
        if (!r.held) {
            fmt::print(out_, " not run (the device cannot hold it)\n");
        } else {
            const RunSummary& s = r.result.summary;
            fmt::print(out_, " peak {} MiB, {:.0f} tokens/s, val loss {:.4f}{}\n", format_mib(r.result.peak_total),
                       s.median_tokens_per_second.value_or(0.0), s.final_val_loss.value_or(NAN),
                       r.fits ? "" : "  (over the budget)");
        }
        std::fflush(out_);
    }
    void rung_not_needed(const LadderRung& r) override {
        line(fmt::format("ladder: rung {:<22} not needed (rung 2 fits the budget)", r.name));
    }
    void ladder_rule(const std::string& rule) override { line(fmt::format("ladder: {}", rule)); }
    void ladder_table(const LadderTable& t, const std::vector<LadderRung>& rungs) override {
        std::string text = "\n";  // not "\n" + ...: GCC 12 warns falsely (-Wrestrict) on that
        text += format_ladder_table(t, rungs);
        line(text);
    }
    void ladder_files(const std::string& dir) override {
        line(fmt::format("ladder: {}/ladder.json, {}/ladder.csv", dir, dir));
    }
    void ladder_plots(const LadderPlots& p) override {
        if (p.exit_code == 0)
            line(fmt::format("ladder: plots in {} (loss_vs_flops.png, loss_vs_wallclock.png, peak_memory.png)", p.dir));
        else if (p.exit_code == 3)
            line(fmt::format("ladder: no plots: matplotlib is missing (Debian: apt-get install python3-matplotlib); "
                             "then run\n  {}",
                             p.command));
        else
            line(fmt::format("ladder: no plots (python3 {}); to make them run\n  {}",
                             p.exit_code == 127 ? std::string("not found") : fmt::format("exited with {}", p.exit_code),
                             p.command));
    }

private:
    void line(std::string_view text) { display_.print(text); }

    std::FILE* out_;
    std::FILE* err_;
    ProgressDisplay display_;
};

}  // namespace snug
