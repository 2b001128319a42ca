// train_gpt: the main job. Trains a GPT-2-style model with every knob that
// decides memory and speed on the command line, logs each update (one JSON
// line per step, a progress display, a summary table) and samples text at the
// end. With no arguments it trains a small model on the built-in synthetic
// corpus (20-60 s on two CPU cores) and prints its validation loss next
// to the corpus's exact entropy floor.
//
// Also: --resume a saved training state (--out DIR keeps DIR/state.snug,
// saved every --save-every updates, at the end, and on Ctrl-C);
// --init-from an llm.c model file or a Hugging Face GPT-2 directory;
// --eval-only; --save-model (llm.c) and --export-hf at the end; --plan (what
// fits a budget, from the memory planner, before anything is allocated);
// --ladder (the VRAM ladder, examples/vram_ladder).
//
// Built by g++ from this file it runs on the host backend; built by nvcc
// (main.cu includes this file) it also runs on snug::Cuda, and --device auto
// picks the GPU when one exists.
//
// Exit codes: 0 done, 1 runtime error (file, numerics), 2 bad command line or
// configuration (also --device cuda without a GPU), 3 out of the memory
// budget, 130 stopped by Ctrl-C (after saving the state).
#include "trainer.hpp"
#include "ladder.hpp"

namespace {

using namespace train_gpt;

int run(int argc, char** argv) {
    Options o;
    LadderOptions ladder;
    bool run_ladder = false;
    CLI::App app{
        "train_gpt: train a GPT-2-style model and measure what each memory/speed choice costs.\n"
        "With no arguments: a small model (2 layers, 4 heads, 128 channels; B 32, T 32, 1000 updates, fp32) on the\n"
        "built-in synthetic corpus.\n"};
    app.option_defaults()->always_capture_default();
    auto* model_opt = add_model_options(app, o);
    app.add_option("--init-from", o.init_from,
                   "start from an llm.c model file (.bin, version 3 or 5) or a Hugging Face GPT-2 directory "
                   "(model.safetensors + config.json); the shape comes from it")
        ->excludes(model_opt);
    app.add_option("--precision", o.precision, "fp32, bf16, or fp16 (dynamic loss scaling)")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
    app.add_option("--batch", o.batch, "micro-batch B (sequences per forward)")->check(CLI::PositiveNumber);
    app.add_option("--seq", o.seq, "sequence length T (also the model's context)")->check(CLI::PositiveNumber);
    auto* accum_opt = app.add_option("--accum", o.accum, "micro-batches per update")->check(CLI::PositiveNumber);
    app.add_option("--batch-tokens", o.batch_tokens, "tokens per update; sets --accum = this / (B T), which must divide")
        ->excludes(accum_opt)
        ->check(CLI::PositiveNumber);
    app.add_option("--checkpoint", o.checkpoint, "none, full, every:K (K = 2, 3, 4), selective, auto (fit --vram-budget)");
    app.add_option("--lr", o.lr, "peak learning rate")->check(CLI::PositiveNumber);
    app.add_option("--warmup", o.warmup, "linear warmup updates")->check(CLI::NonNegativeNumber);
    app.add_option("--min-lr-frac", o.min_lr_frac, "cosine decay floor as a fraction of --lr")->check(CLI::Range(0.0, 1.0));
    app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay (2-D weights)")->check(CLI::NonNegativeNumber);
    app.add_option("--clip", o.clip, "gradient-norm clipping (<= 0: off)");
    app.add_option("--steps", o.steps, "optimizer updates (in all, counting those of a resumed run)")
        ->check(CLI::PositiveNumber);
    app.add_option("--eval-every", o.eval_every, "updates between validation losses")->check(CLI::PositiveNumber);
    app.add_option("--eval-batches", o.eval_batches, "validation micro-batches per evaluation")->check(CLI::PositiveNumber);
    app.add_flag("--eval-only", o.eval_only, "only print the validation loss of the model (e.g. --init-from FILE)");
    app.add_option("--seed", o.seed, "weights and sampling seed");
    app.add_option("--out", o.out, "directory for metrics.jsonl, summary.json and state.snug (empty: no files)");
    app.add_option("--resume", o.resume, "continue from a training state (a state.snug of an earlier --out)");
    app.add_option("--save-every", o.save_every, "updates between state saves (0: at the end and on Ctrl-C only)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--stop-after", o.stop_after,
                   "stop after this update and save the state, as Ctrl-C would (for time-sliced jobs; 0: never)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--save-model", o.save_model, "write the trained model as an llm.c model file at the end");
    app.add_option("--model-dtype", o.model_dtype, "--save-model's parameters: fp32 (llm.c version 3) or bf16 (version 5)")
        ->check(CLI::IsMember({"fp32", "bf16"}));
    app.add_option("--export-hf", o.export_hf, "write model.safetensors + config.json (Hugging Face GPT-2) to this directory");
    app.add_option("--vram-budget", o.vram_budget, "memory budget (e.g. 12GiB, 500MiB, none); over it: exit 3");
    app.add_option("--device", o.device, "cuda, host, or auto (the GPU if one exists)")
        ->check(CLI::IsMember({"cuda", "host", "auto"}));
    app.add_option("--data", o.data, "builtin, text:PATH (bytes), tokens:GLOB (llm.c token files)");
    app.add_option("--alphabet", o.alphabet, "characters of the built-in corpus (4..48; more: harder)")
        ->check(CLI::Range(4, 48));
    app.add_option("--val", o.val, "validation data for tokens: (tokens:GLOB); default: the last 10% of --data");
    app.add_option("--tokenizer", o.tokenizer, "llm.c tokenizer file (gpt2_tokenizer.bin) to print token samples as text");
    app.add_option("--sample", o.sample, "tokens to generate at the end (0: none)")->check(CLI::NonNegativeNumber);
    app.add_option("--prompt", o.prompt, "prompt text for the sample (default: the start of the validation data)");
    app.add_option("--temperature", o.temperature, "sampling temperature (0: greedy)")->check(CLI::NonNegativeNumber);
    app.add_option("--top-k", o.top_k, "sample among the k likeliest tokens (0: all)")->check(CLI::NonNegativeNumber);
    app.add_option("--flops-budget", o.flops_budget,
                   "model FLOPs at which 'loss at equal FLOPs' is read (0: the run's total); give two runs the same")
        ->check(CLI::NonNegativeNumber);
    app.add_flag("--plan", o.plan,
                 "print what fits --vram-budget (the fastest configuration, the largest model) and exit; "
                 "nothing is allocated");
    app.add_flag("--ladder", run_ladder, "run the VRAM ladder (see vram_ladder --help) with these model/data options");
    app.add_option("--ladder-out", ladder.out, "with --ladder: directory for ladder.csv / ladder.json");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int code = app.exit(e);
        return code == 0 ? 0 : 2;
    }

    o.checkpoint_kind = parse_checkpoint(o.checkpoint);
    if (o.vram_budget != "none") o.budget_bytes = snug::parse_bytes(o.vram_budget);
    if (o.batch_tokens > 0) {
        const std::int64_t bt = std::int64_t{o.batch} * o.seq;
        if (o.batch_tokens % bt != 0)
            throw snug::ConfigError("--batch-tokens " + std::to_string(o.batch_tokens) + " is not a multiple of B T = " +
                                    std::to_string(bt) + " tokens per micro-batch");
        o.accum = static_cast<int>(o.batch_tokens / bt);
    }
    if (o.eval_only && !o.resume.empty())
        throw snug::ConfigError("--eval-only takes a model file (--init-from), not a training state");

    const snug::GPTConfig shape = model_shape(o);

    const DeviceInfo device = choose_device(o.device);
    if (o.plan) return print_plan(o, shape, device);
    if (run_ladder) return run_ladder_program(o, ladder, shape, device);

    const std::int64_t tokens_per_update = std::int64_t{o.accum} * o.batch * o.seq;
    const Data data = load_data(o, tokens_per_update * o.steps + 1);
    const ModelSource source = model_source(o, shape, data.vocab);
    const snug::GPTConfig& config = source.config;
    std::optional<snug::data::Tokenizer> tokenizer;
    if (!o.tokenizer.empty()) tokenizer.emplace(o.tokenizer);

    std::printf("device: %s\n", device.description.c_str());
    std::printf("model: %d layers, %d heads, %d channels, context %d, vocab %d: %.2fM parameters, %.3g FLOPs/token; %s\n",
                config.n_layer, config.n_head, config.channels, config.max_seq_len, config.vocab_size,
                static_cast<double>(config.num_parameters()) / 1e6, config.flops_per_token(o.seq),
                source.description.c_str());
    std::printf("data: %s\n", data.description.c_str());
    if (o.eval_only) {
        std::fflush(stdout);
#if defined(SNUG_CUDA_BACKEND)
        if (device.cuda) return run_evaluation<snug::Cuda>(o, data, source, tokenizer ? &*tokenizer : nullptr);
#endif
        return run_evaluation<snug::Host>(o, data, source, tokenizer ? &*tokenizer : nullptr);
    }
    std::printf("precision %s, checkpoint %s, micro-batch %d x %d, %d per update: %lld tokens/update, %d updates\n",
                o.precision.c_str(), o.checkpoint.c_str(), o.batch, o.seq, o.accum,
                static_cast<long long>(tokens_per_update), o.steps);
    std::printf("lr %.3g (warmup %d, cosine to %.3g x), weight decay %.3g, clip %.3g; memory budget %s\n",
                static_cast<double>(o.lr), o.warmup, static_cast<double>(o.min_lr_frac),
                static_cast<double>(o.weight_decay), static_cast<double>(o.clip),
                o.budget_bytes ? snug::format_bytes(*o.budget_bytes).c_str() : "none");
    print_memory_outlook(o, config, device);
    if (!o.out.empty()) std::filesystem::create_directories(o.out);
    std::fflush(stdout);

    install_stop_handler();
    RunResult r;
#if defined(SNUG_CUDA_BACKEND)
    if (device.cuda)
        r = run_training<snug::Cuda>(o, data, source, device, tokenizer ? &*tokenizer : nullptr);
    else
#endif
        r = run_training<snug::Host>(o, data, source, device, tokenizer ? &*tokenizer : nullptr);
    if (!r.fit) {
        std::fflush(stdout);
        std::fprintf(stderr, "\ntrain_gpt: OutOfMemory: %s\n", r.out_of_memory.c_str());
    }
    return r.exit_code;
}

}  // namespace

int main(int argc, char** argv) { return guarded_main("train_gpt", [&] { return run(argc, argv); }); }
