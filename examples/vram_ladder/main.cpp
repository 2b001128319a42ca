// vram_ladder: the experiment snug exists for. One model, one memory budget,
// the recommended order of operations walked rung by rung — fp32, mixed
// precision, accumulation, activation checkpointing, a shorter context — and
// each rung measured: peak memory (total and by category, beside the
// planner's prediction), tokens/s, loss per unit of compute, wall-clock,
// validation loss, and whether it fit (include/snug/train/ladder.hpp says how).
//
//   vram_ladder                                  # host: a small model, a few minutes
//   vram_ladder --model 124M --seq 1024 --batch 16 --vram-budget 12GiB --data tokens:...   # a GPU
//   python3 tools/plot_ladder.py OUT/ladder.json --out OUT    # the plots (the
//                                                              # ladder runs it when matplotlib is there)
//
// Built by nvcc (main.cu) it runs on the GPU when there is one. Its text is
// printed by the TextReport report.cpp makes, always host code (fmt, which
// nvcc cannot compile).
#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>

#include "snug/train/engine_extern.hpp"  // the run loops, instantiated once (examples/gpt_engine.cpp); first
#include "snug/train/command_line.hpp"
#include "snug/train/exit_codes.hpp"
#include "snug/train/ladder.hpp"
#include "snug/train/options.hpp"
#include "snug/train/report.hpp"
#include "snug/train/run_spec.hpp"
#include "snug/train/session.hpp"

// The report that prints everything (report.cpp).
std::unique_ptr<snug::Report> make_report();

namespace {

int run(int argc, char** argv) {
    snug::TrainOptions o;
    // The host default: 4 layers, 4 heads, 128 channels, T 128, 16 sequences
    // per update, under a budget that the wanted batch in fp32 exceeds.
    o.layers = 4;
    o.heads = 4;
    o.channels = 128;
    o.run.seq = 128;
    o.run.micro_batch = 16;
    o.steps = 60;
    o.warmup = 10;
    o.lr = 1e-3f;  // 3e-3 (train_gpt's default for 2 layers) spikes at 4 layers and T 128
    o.eval_every = 1000000;  // the end only
    o.eval_batches = 4;
    std::string vram_budget = "48MiB", device_name = "auto", mixed = "auto", checkpoint = "selective";
    std::string attention = "auto";
    snug::LadderOptions lo;
    lo.out = "ladder_out";
#if defined(SNUG_PLOT_LADDER_SCRIPT)
    lo.plot_script = SNUG_PLOT_LADDER_SCRIPT;  // the source tree's tools/plot_ladder.py (examples/CMakeLists.txt)
#endif
    CLI::App app{"vram_ladder: walk the order of operations for one model under one memory budget and measure "
                 "each rung."};
    app.option_defaults()->always_capture_default();
    snug::cli::add_model_options(app, o);
    app.add_option("--batch", o.run.micro_batch, "the wanted batch: sequences per update")->check(snug::cli::positive);
    app.add_option("--seq", o.run.seq, "sequence length T (rung 5 halves it)")->check(CLI::Range(2, 1 << 20));
    app.add_option("--steps", o.steps, "updates per rung (every rung trains as many tokens)")->check(snug::cli::positive);
    app.add_option("--lr", o.lr, "peak learning rate")->check(snug::cli::positive);
    app.add_option("--warmup", o.warmup, "linear warmup updates")->check(snug::cli::non_negative);
    app.add_option("--eval-batches", o.eval_batches, "validation micro-batches at the end of each rung")
        ->check(snug::cli::positive);
    app.add_option("--seed", o.seed, "weights seed (the same for every rung)");
    app.add_option("--vram-budget", vram_budget, "the memory budget the ladder fits (e.g. 12GiB, 48MiB)");
    app.add_option("--device", device_name, "cuda, host, or auto")->check(CLI::IsMember({"cuda", "host", "auto"}));
    app.add_option("--data", o.data, "builtin, text:PATH, tokens:GLOB");
    app.add_option("--val", o.val, "validation tokens:GLOB for tokens: data");
    app.add_option("--alphabet", o.alphabet, "characters of the built-in corpus")->check(CLI::Range(4, 48));
    app.add_option("--ladder-precision", mixed, "rung 2: bf16, fp16 (dynamic loss scaling), auto (bf16)")
        ->check(CLI::IsMember({"bf16", "fp16", "auto"}));
    app.add_option("--ladder-checkpoint", checkpoint, "rung 4's policy: selective, full, every:2, every:3, every:4")
        ->check(CLI::IsMember({"selective", "full", "every:2", "every:3", "every:4"}));
    app.add_option("--out", lo.out, "directory for ladder.csv and ladder.json (empty: the table only)");
    app.add_option("--attention", attention,
                   "auto (cuDNN's fused SDPA where this program has it and runs on the GPU, else flash), cudnn, "
                   "flash or materialized")
        ->check(snug::cli::parsed_by([](const std::string& s) { return snug::parse_attention_kind(s); },
                                     "auto|cudnn|flash|materialized"));
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int code = app.exit(e);
        return code == 0 ? 0 : 2;
    }
    o.budget_bytes = vram_budget == "none" ? std::nullopt : std::optional(snug::parse_bytes(vram_budget));
    if (mixed != "auto") lo.mixed = snug::parse_precision_kind(mixed);
    lo.checkpoint = snug::parse_checkpoint_kind(checkpoint, "--ladder-checkpoint");
    // An unknown --model preset, or a model file for a family that has none,
    // is refused before any device is touched.
    snug::visit_arch(o.arch, [&]<class Config>() {
        (void)o.shape<Config>();
        snug::check_model_files<Config>(o);
    });
    const snug::DeviceInfo device = snug::choose_device(device_name);
    o.attention = snug::resolve_attention(snug::parse_attention_kind(attention, "--attention"), device);
    return snug::visit_arch(o.arch, [&]<class Config>() {
        return snug::run_ladder_program<Config>(o, lo, device, *make_report());
    });
}

}  // namespace

int main(int argc, char** argv) { return snug::guarded_main("vram_ladder", [&] { return run(argc, argv); }); }
