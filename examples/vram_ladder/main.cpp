// vram_ladder: the experiment snug exists for. One model, one memory budget,
// the recommended order of operations walked rung by rung — fp32, mixed
// precision, accumulation, activation checkpointing, a shorter context — and
// each rung measured: peak memory (total and by category, beside the
// planner's prediction), tokens/s, loss per unit of compute, wall-clock,
// validation loss, and whether it fit (examples/train_gpt/ladder.hpp says how).
//
//   vram_ladder                                  # host: a small model, a few minutes
//   vram_ladder --model 124M --seq 1024 --batch 16 --vram-budget 12GiB --data tokens:...   # a GPU
//   python3 tools/plot_ladder.py OUT/ladder.json --out OUT    # the plots
//
// Built by nvcc (main.cu) it runs on the GPU when there is one.
#include "../train_gpt/ladder.hpp"

namespace {

using namespace train_gpt;

int run(int argc, char** argv) {
    Options o;
    // The host default: 4 layers, 4 heads, 128 channels, T 128, 16 sequences
    // per update, under a budget that the wanted batch in fp32 exceeds.
    o.layers = 4;
    o.heads = 4;
    o.channels = 128;
    o.seq = 128;
    o.batch = 16;
    o.steps = 60;
    o.warmup = 10;
    o.lr = 1e-3f;  // 3e-3 (train_gpt's default for 2 layers) spikes at 4 layers and T 128
    o.eval_every = 1000000;  // the end only
    o.eval_batches = 4;
    o.vram_budget = "48MiB";
    LadderOptions lo;
    lo.out = "ladder_out";
    CLI::App app{"vram_ladder: walk the order of operations for one model under one memory budget and measure "
                 "each rung."};
    app.option_defaults()->always_capture_default();
    add_model_options(app, o);
    app.add_option("--batch", o.batch, "the wanted batch: sequences per update")->check(CLI::PositiveNumber);
    app.add_option("--seq", o.seq, "sequence length T (rung 5 halves it)")->check(CLI::Range(2, 1 << 20));
    app.add_option("--steps", o.steps, "updates per rung (every rung trains as many tokens)")->check(CLI::PositiveNumber);
    app.add_option("--lr", o.lr, "peak learning rate")->check(CLI::PositiveNumber);
    app.add_option("--warmup", o.warmup, "linear warmup updates")->check(CLI::NonNegativeNumber);
    app.add_option("--eval-batches", o.eval_batches, "validation micro-batches at the end of each rung")
        ->check(CLI::PositiveNumber);
    app.add_option("--seed", o.seed, "weights seed (the same for every rung)");
    app.add_option("--vram-budget", o.vram_budget, "the memory budget the ladder fits (e.g. 12GiB, 48MiB)");
    app.add_option("--device", o.device, "cuda, host, or auto")->check(CLI::IsMember({"cuda", "host", "auto"}));
    app.add_option("--data", o.data, "builtin, text:PATH, tokens:GLOB");
    app.add_option("--val", o.val, "validation tokens:GLOB for tokens: data");
    app.add_option("--alphabet", o.alphabet, "characters of the built-in corpus")->check(CLI::Range(4, 48));
    app.add_option("--ladder-precision", lo.mixed, "rung 2: bf16, fp16 (dynamic loss scaling), auto (bf16)")
        ->check(CLI::IsMember({"bf16", "fp16", "auto"}));
    app.add_option("--ladder-checkpoint", lo.checkpoint, "rung 4's policy: selective, full, every:2, every:3, every:4")
        ->check(CLI::IsMember({"selective", "full", "every:2", "every:3", "every:4"}));
    app.add_option("--out", lo.out, "directory for ladder.csv and ladder.json (empty: the table only)");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int code = app.exit(e);
        return code == 0 ? 0 : 2;
    }
    if (o.vram_budget != "none") o.budget_bytes = snug::parse_bytes(o.vram_budget);
    const snug::GPTConfig shape = model_shape(o);
    return run_ladder_program(o, lo, shape, choose_device(o.device));
}

}  // namespace

int main(int argc, char** argv) { return guarded_main("vram_ladder", [&] { return run(argc, argv); }); }
