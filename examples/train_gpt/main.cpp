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
// This file is only the command line: it fills snug::TrainOptions and calls
// the engine in include/snug/train/ (run.hpp, run_plan.hpp, ladder.hpp), so a
// trainer of your own can start from a copy of it. What the engine reports
// is printed by the TextReport that report.cpp makes: a file of its own,
// always compiled by the host compiler, because the text is formatted with
// fmt and nvcc cannot compile fmt.
//
// Data parallel: `mpirun -np N train_gpt ...` trains on N ranks (built with
// MPI, Debian's libopenmpi-dev): each rank trains on its --batch sequences of
// every micro-step, rank 0 prints and writes the files (README: launching).
// On GPUs each rank takes its machine's GPU number local-rank and the
// gradients are summed by NCCL; elsewhere (host, emulated GPU) through MPI.
//
// Exit codes: 0 done, 1 runtime error (file, numerics), 2 bad command line or
// configuration (also --device cuda without a GPU), 3 out of the memory
// budget (or of host memory), 130 stopped by Ctrl-C (after saving the state).
#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "snug/train/engine_extern.hpp"  // the run loops, instantiated once (examples/gpt_engine.cpp); first
#include "snug/train/command_line.hpp"
#include "snug/data/tokenizer.hpp"
#include "snug/dist/ranks.hpp"
#if defined(SNUG_HAVE_MPI)
#include "snug/dist/mpi.hpp"
#endif
#if defined(SNUG_HAVE_NCCL)
#include "snug/dist/nccl.hpp"
#endif
#include "snug/train/exit_codes.hpp"
#include "snug/train/ladder.hpp"
#include "snug/train/model_source.hpp"
#include "snug/train/options.hpp"
#include "snug/train/report.hpp"
#include "snug/train/run.hpp"
#include "snug/train/run_plan.hpp"
#include "snug/train/run_spec.hpp"
#include "snug/train/session.hpp"

// The report that prints everything (report.cpp).
std::unique_ptr<snug::Report> make_report();

namespace {

int run(int argc, char** argv, snug::dist::Ranks& ranks) {
    snug::TrainOptions o;
    double rank_timeout = 600.0;
    // What the command line says as text; parsed into o once CLI11 is done.
    std::string precision = "fp32", checkpoint = "none", vram_budget = "12GiB", device_name = "auto";
    std::string attention = "auto";
    std::string optimizer_state = "fp32", master = "fp32";
    std::string tokenizer_path;
    std::int64_t batch_tokens = 0;
    bool eval_only = false, plan = false;
    snug::LadderOptions ladder;
#if defined(SNUG_PLOT_LADDER_SCRIPT)
    ladder.plot_script = SNUG_PLOT_LADDER_SCRIPT;  // the source tree's tools/plot_ladder.py (examples/CMakeLists.txt)
#endif
    bool run_ladder = false;
    CLI::App app{
        "train_gpt: train a GPT-2-style model and measure what each memory/speed choice costs.\n"
        "With no arguments: a small model (2 layers, 4 heads, 128 channels; B 32, T 32, 1000 updates, fp32) on the\n"
        "built-in synthetic corpus.\n"};
    app.option_defaults()->always_capture_default();
    auto* model_opt = snug::cli::add_model_options(app, o);
    app.add_option("--init-from", o.init_from,
                   "start from an llm.c model file (.bin, version 3 or 5) or a Hugging Face GPT-2 directory "
                   "(model.safetensors + config.json); the shape comes from it")
        ->excludes(model_opt);
    app.add_option("--precision", precision, "fp32, bf16, or fp16 (dynamic loss scaling)")
        ->check(snug::cli::parsed_by(snug::parse_precision_kind, snug::cli::choices(snug::precision_names())));
    app.add_option("--batch", o.run.micro_batch, "micro-batch B (sequences per forward)")->check(snug::cli::positive);
    app.add_option("--seq", o.run.seq, "sequence length T (also the model's context)")->check(snug::cli::positive);
    auto* accum_opt = app.add_option("--accum", o.run.accumulation, "micro-batches per update")->check(snug::cli::positive);
    app.add_option("--batch-tokens", batch_tokens, "tokens per update; sets --accum = this / (B T), which must divide")
        ->excludes(accum_opt)
        ->check(snug::cli::positive);
    app.add_option("--optimizer-state", optimizer_state,
                   "AdamW's moments: fp32, bf16 (stochastically rounded; half the optimizer memory), or int8 "
                   "(8-bit block-wise codes for the weight matrices, stochastically rounded; about a quarter)")
        ->check(snug::cli::parsed_by(snug::parse_moment_storage, "fp32|bf16|int8"));
    app.add_flag("--offload", o.run.offload,
                 "keep AdamW's state (master weights, moments) in host memory and update on the CPU; the GPU "
                 "holds the weights, gradients and activations only");
    app.add_option("--master", master,
                   "master weights: fp32, or none (bf16 weights updated in place, stochastically rounded; "
                   "--precision bf16 only)")
        ->check(snug::cli::parsed_by(snug::parse_master_storage, "fp32|none"));
    app.add_option("--checkpoint", checkpoint, "none, full, every:K (K = 2, 3, 4), selective, auto (fit --vram-budget)");
    app.add_option("--attention", attention,
                   "auto (cuDNN's fused SDPA where this program has it and runs on the GPU, else flash), cudnn, "
                   "flash (snug's kernels; one log-sum-exp per row kept) or materialized (keeps the B NH T T "
                   "probabilities)")
        ->check(snug::cli::parsed_by([](const std::string& s) { return snug::parse_attention_kind(s); },
                                     "auto|cudnn|flash|materialized"));
    app.add_option("--classifier-chunk", o.classifier_chunk,
                   "tokens per chunk of the output head and loss (0: automatic, the logits of a chunk about the size "
                   "of the hidden states)")
        ->check(snug::cli::non_negative);
    app.add_option("--lr", o.lr, "peak learning rate")->check(snug::cli::positive);
    app.add_option("--warmup", o.warmup, "linear warmup updates")->check(snug::cli::non_negative);
    app.add_option("--min-lr-frac", o.min_lr_frac, "cosine decay floor as a fraction of --lr")->check(CLI::Range(0.0, 1.0));
    app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay (2-D weights)")->check(snug::cli::non_negative);
    app.add_option("--clip", o.clip, "gradient-norm clipping (<= 0: off)");
    app.add_option("--steps", o.steps, "optimizer updates (in all, counting those of a resumed run)")
        ->check(snug::cli::positive);
    app.add_option("--eval-every", o.eval_every, "updates between validation losses")->check(snug::cli::positive);
    app.add_option("--eval-batches", o.eval_batches, "validation micro-batches per evaluation")->check(snug::cli::positive);
    app.add_flag("--eval-only", eval_only, "only print the validation loss of the model (e.g. --init-from FILE)");
    app.add_option("--seed", o.seed, "weights and sampling seed");
    auto* out_opt = app.add_option("--out", o.out, "directory for metrics.jsonl, summary.json and state.snug (empty: no files)");
    app.add_option("--resume", o.resume, "continue from a training state (a state.snug of an earlier --out)");
    app.add_option("--save-every", o.save_every, "updates between state saves into --out (0: at the end and on Ctrl-C only)")
        ->check(snug::cli::non_negative)
        ->needs(out_opt);
    app.add_option("--stop-after", o.stop_after,
                   "stop after this update and save the state into --out, as Ctrl-C would (for time-sliced jobs; 0: never)")
        ->check(snug::cli::non_negative)
        ->needs(out_opt);
    app.add_option("--save-model", o.save_model, "write the trained model as an llm.c model file at the end");
    app.add_option("--model-dtype", o.model_dtype, "--save-model's parameters: fp32 (llm.c version 3) or bf16 (version 5)")
        ->check(CLI::IsMember({"fp32", "bf16"}));
    app.add_option("--export-hf", o.export_hf, "write model.safetensors + config.json (Hugging Face GPT-2) to this directory");
    app.add_option("--vram-budget", vram_budget, "memory budget (e.g. 12GiB, 500MiB, none); over it: exit 3");
    app.add_option("--device", device_name, "cuda, host, or auto (the GPU if one exists)")
        ->check(CLI::IsMember({"cuda", "host", "auto"}));
    app.add_option("--data", o.data, "builtin, text:PATH (bytes), tokens:GLOB (llm.c token files)");
    app.add_option("--alphabet", o.alphabet, "characters of the built-in corpus (4..48; more: harder)")
        ->check(CLI::Range(4, 48));
    app.add_option("--val", o.val, "validation data for tokens: (tokens:GLOB); default: the last 10% of --data");
    app.add_option("--tokenizer", tokenizer_path, "llm.c tokenizer file (gpt2_tokenizer.bin) to print token samples as text");
    app.add_option("--sample", o.sample, "tokens to generate at the end (0: none)")->check(snug::cli::non_negative);
    app.add_option("--prompt", o.prompt, "prompt text for the sample (default: the start of the validation data)");
    app.add_option("--temperature", o.temperature, "sampling temperature (0: greedy)")->check(snug::cli::non_negative);
    app.add_option("--top-k", o.top_k, "sample among the k likeliest tokens (0: all)")->check(snug::cli::non_negative);
    app.add_option("--flops-budget", o.flops_budget,
                   "model FLOPs at which 'loss at equal FLOPs' is read (0: the run's total); give two runs the same")
        ->check(snug::cli::non_negative);
    app.add_flag("--plan", plan,
                 "print what fits --vram-budget (the fastest configuration, the largest model) and exit; "
                 "nothing is allocated");
    app.add_flag("--ladder", run_ladder, "run the VRAM ladder (see vram_ladder --help) with these model/data options");
    app.add_option("--ladder-out", ladder.out, "with --ladder: directory for ladder.csv / ladder.json");
    app.add_flag("--zero", o.zero,
                 "under mpirun: shard AdamW's state (master weights, moments) across the ranks (ZeRO-1): each "
                 "keeps 1/N of it");
    app.add_option("--rank-timeout", rank_timeout,
                   "under mpirun: seconds a rank waits for the others in a collective before the job stops, "
                   "naming the ranks that never came")
        ->check(snug::cli::positive);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (ranks.rank() != 0) return e.get_exit_code() == 0 ? 0 : 2;  // rank 0 says it
        const int code = app.exit(e);
        return code == 0 ? 0 : 2;
    }
    ranks.set_timeout(rank_timeout);

    o.run.precision = snug::parse_precision_kind(precision);
    o.run.checkpoint = snug::parse_checkpoint_kind(checkpoint, "--checkpoint");
    o.run.moments = snug::parse_moment_storage(optimizer_state);
    o.run.master = snug::parse_master_storage(master);
    o.attention = snug::parse_attention_kind(attention, "--attention");
    o.budget_bytes = vram_budget == "none" ? std::nullopt : std::optional(snug::parse_bytes(vram_budget));
    if (batch_tokens > 0) {
        const std::int64_t bt = std::int64_t{o.run.micro_batch} * o.run.seq;
        if (batch_tokens % bt != 0)
            throw snug::ConfigError("--batch-tokens " + std::to_string(batch_tokens) + " is not a multiple of B T = " +
                                    std::to_string(bt) + " tokens per micro-batch");
        o.run.accumulation = static_cast<int>(batch_tokens / bt);
    }
    if (eval_only && !o.resume.empty())
        throw snug::ConfigError("--eval-only takes a model file (--init-from), not a training state");

    // An unknown --model preset, or a model file for a family that has none,
    // is refused before any device is touched.
    snug::visit_arch(o.arch, [&]<class Config>() {
        (void)o.shape<Config>();
        snug::check_model_files<Config>(o);
    });
#if defined(SNUG_HAVE_NCCL)
    // One GPU per rank: this rank's, before any CUDA work.
    if (ranks.size() > 1 && device_name != "host" && snug::cuda::device_count() > 0) snug::dist::use_local_gpu(ranks);
#endif
    const snug::DeviceInfo device = snug::choose_device(device_name);
    o.attention = snug::resolve_attention(o.attention, device);
    if (ranks.size() > 1 && run_ladder)
        throw snug::ConfigError("--ladder runs in one process; this job has " + std::to_string(ranks.size()) +
                                " ranks: start it without mpirun");
    o.ranks = ranks.size();
    // Rank 0 reports; the others compute the same numbers and say nothing.
    // (--plan under mpirun plans one rank of the job: with --zero, its shard.)
    const std::unique_ptr<snug::Report> report =
        ranks.rank() == 0 ? make_report() : std::make_unique<snug::Report>();
    // The rest is written once for every family (--arch): Config is its
    // model's config type (train/arch.hpp).
    return snug::visit_arch(o.arch, [&]<class Config>() -> int {
        if (plan) return snug::run_plan_program<Config>(o, device, *report);
        if (run_ladder) return snug::run_ladder_program<Config>(o, ladder, device, *report);

        const std::int64_t tokens_per_update = o.run.tokens_per_update() * o.ranks;
        // A run the machine's memory cannot hold is refused before its weights are made.
        const snug::RunInputsOf<Config> inputs =
            snug::load_inputs<Config>(o, tokens_per_update * o.steps + 1, [&](const Config& c) {
                if (!eval_only) snug::check_host_memory(o, c, device);
            });
        const snug::TrainData& data = inputs.data;
        const snug::ModelSourceOf<Config>& source = inputs.source;
        const Config& config = source.config;
        std::optional<snug::data::Tokenizer> tokenizer;
        if (!tokenizer_path.empty()) tokenizer.emplace(tokenizer_path);
        const snug::data::Tokenizer* decoder = tokenizer ? &*tokenizer : nullptr;

        report->device(device);
        report->model(snug::model_summary(config), o.run.seq, source.description);
        report->data(data);
        if (eval_only)
            return snug::visit_device(
                device, [&]<class Dev>() { return snug::run_evaluation<Dev>(o, data, source, *report, decoder); });
        report->training_setup(o);
        snug::report_memory_outlook(o, config, device, *report);

        snug::install_stop_handler();
        const snug::RunResult r = snug::visit_device(device, [&]<class Dev>() {
#if defined(SNUG_HAVE_NCCL)
            // GPUs sum their gradients with NCCL, on the device (the training stream: Cuda{}'s).
            if constexpr (std::is_same_v<Dev, snug::Cuda>) {
                if (ranks.size() > 1) {
                    snug::dist::NcclCommunicator nccl(ranks, snug::Cuda{});
                    return snug::run_training<Dev>(o, data, source, device, *report, decoder, ranks, &nccl);
                }
            }
#endif
            return snug::run_training<Dev>(o, data, source, device, *report, decoder, ranks);
        });
        if (!r.fit) {
            std::fflush(stdout);
            std::fprintf(stderr, "\ntrain_gpt: OutOfMemory: %s\n", r.out_of_memory.c_str());
        }
        return r.exit_code;
    });
}

}  // namespace

int main(int argc, char** argv) {
#if defined(SNUG_HAVE_MPI)
    const std::unique_ptr<snug::dist::Ranks> ranks = snug::dist::join_ranks(&argc, &argv);
#else
    if (snug::dist::launched_by_mpi()) {
        std::fprintf(stderr, "train_gpt: started by mpirun, but built without MPI (libopenmpi-dev): each copy would "
                             "train alone and write the same files\n");
        return 2;
    }
    const std::unique_ptr<snug::dist::Ranks> ranks = std::make_unique<snug::dist::SingleProcess>();
#endif
    const std::string name = ranks->size() > 1 ? "train_gpt (rank " + std::to_string(ranks->rank()) + " of " +
                                                     std::to_string(ranks->size()) + ")"
                                               : std::string("train_gpt");
    return snug::guarded_main(name.c_str(), [&] { return run(argc, argv, *ranks); },
                              [&](int code) { ranks->abort(code); });
}
