// train_main: a whole training program — train_gpt's command line and
// everything behind it (the run loop, --plan, --checkpoint auto, --ladder,
// metrics and summary files, state files and --resume, data parallel under
// mpirun, --offload, sampling, evaluation) — for GPT-2 and Llama (--arch),
// or for a CausalLM family of your own:
//
//     std::unique_ptr<snug::Report> make_report();  // report.cpp: TextReport
//     int main(int argc, char** argv) {
//         return snug::train_main<MyFamily>(argc, argv, {"my_trainer", "train MyFamily", make_report});
//     }
//
// A family of your own takes its shape from --layers and from
// `static BlockShape block_shape(int heads, int channels)` (heads may be
// ignored); it has no presets, and the model files (llm.c, Hugging Face:
// GPT-2's) are refused by flag. examples/custom_layer is such a program.
//
// The report is made by a function the program passes because it is printed
// with fmt, which nvcc cannot compile: a CUDA program (main.cu) makes it in a
// file of its own that the host compiler builds (examples/*/report.cpp).
//
// Exit codes: 0 done, 1 runtime error (file, numerics), 2 bad command line or
// configuration (also --device cuda without a GPU), 3 out of the memory
// budget (or of host memory), 130 stopped by Ctrl-C (after saving the state).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "snug/data/tokenizer.hpp"
#include "snug/dist/ranks.hpp"
#include "snug/nn/causal_lm.hpp"
#include "snug/train/command_line.hpp"
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

namespace snug {

// What a training program says about itself.
struct Program {
    const char* name;   // starts every message ("train_gpt")
    const char* about;  // --help's first lines, after the name
    std::unique_ptr<Report> (*make_report)();  // what prints the run (a TextReport)
};

namespace detail {

// The families a program trains, turned into the model's config type.
// GPT-2 and Llama, as --arch says (train/arch.hpp).
struct BuiltinFamilies {
    static constexpr bool by_arch = true;
    template <class F>
    auto operator()(const TrainOptions& o, F&& f) const {
        return visit_arch(o.arch, f);
    }
};

// One family of a program's own.
template <class Family>
struct OneFamily {
    static constexpr bool by_arch = false;
    template <class F>
    auto operator()(const TrainOptions&, F&& f) const {
        return f.template operator()<CausalLMConfig<Family>>();
    }
};

template <class Families>
int train_program(int argc, char** argv, const Program& program, Families families, dist::Ranks& ranks) {
    TrainOptions o;
    double rank_timeout = 600.0;
    // What the command line says as text; parsed into o once CLI11 is done.
    std::string precision = "fp32", checkpoint = "none", vram_budget = "12GiB", device_name = "auto";
    std::string attention = "auto";
    std::string optimizer_state = "fp32", master = "fp32";
    std::string tokenizer_path;
    std::int64_t batch_tokens = 0;
    bool eval_only = false, plan = false;
    LadderOptions ladder;
#if defined(SNUG_PLOT_LADDER_SCRIPT)
    ladder.plot_script = SNUG_PLOT_LADDER_SCRIPT;  // the source tree's tools/plot_ladder.py (examples/CMakeLists.txt)
#endif
    bool run_ladder = false;
    CLI::App app{std::string(program.name) + ": " + program.about};
    app.option_defaults()->always_capture_default();
    auto* model_opt = cli::add_model_options(app, o, Families::by_arch);
    app.add_option("--init-from", o.init_from,
                   "start from an llm.c model file (.bin, version 3 or 5) or a Hugging Face GPT-2 directory "
                   "(model.safetensors + config.json); the shape comes from it")
        ->excludes(model_opt);
    app.add_option("--precision", precision, "fp32, bf16, or fp16 (dynamic loss scaling)")
        ->check(cli::parsed_by(parse_precision_kind, cli::choices(precision_names())));
    app.add_option("--batch", o.run.micro_batch, "micro-batch B (sequences per forward)")->check(cli::positive);
    app.add_option("--seq", o.run.seq, "sequence length T (also the model's context)")->check(cli::positive);
    auto* accum_opt = app.add_option("--accum", o.run.accumulation, "micro-batches per update")->check(cli::positive);
    app.add_option("--batch-tokens", batch_tokens, "tokens per update; sets --accum = this / (B T), which must divide")
        ->excludes(accum_opt)
        ->check(cli::positive);
    app.add_option("--optimizer-state", optimizer_state,
                   "AdamW's moments: fp32, bf16 (stochastically rounded; half the optimizer memory), or int8 "
                   "(8-bit block-wise codes for the weight matrices, stochastically rounded; about a quarter)")
        ->check(cli::parsed_by(parse_moment_storage, "fp32|bf16|int8"));
    app.add_flag("--offload", o.run.offload,
                 "keep AdamW's state (master weights, moments) in host memory and update on the CPU; the GPU "
                 "holds the weights, gradients and activations only");
    app.add_option("--master", master,
                   "master weights: fp32, or none (bf16 weights updated in place, stochastically rounded; "
                   "--precision bf16 only)")
        ->check(cli::parsed_by(parse_master_storage, "fp32|none"));
    app.add_option("--checkpoint", checkpoint, "none, full, every:K (K = 2, 3, 4), selective, auto (fit --vram-budget)");
    app.add_option("--attention", attention,
                   "auto (cuDNN's fused SDPA where this program has it and runs on the GPU, else flash), cudnn, "
                   "flash (snug's kernels; one log-sum-exp per row kept) or materialized (keeps the B NH T T "
                   "probabilities)")
        ->check(cli::parsed_by([](const std::string& s) { return parse_attention_kind(s); },
                                     "auto|cudnn|flash|materialized"));
    app.add_option("--classifier-chunk", o.classifier_chunk,
                   "tokens per chunk of the output head and loss (0: automatic, the logits of a chunk about the size "
                   "of the hidden states)")
        ->check(cli::non_negative);
    app.add_option("--lr", o.lr, "peak learning rate")->check(cli::positive);
    app.add_option("--warmup", o.warmup, "linear warmup updates")->check(cli::non_negative);
    app.add_option("--min-lr-frac", o.min_lr_frac, "cosine decay floor as a fraction of --lr")->check(CLI::Range(0.0, 1.0));
    app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay (2-D weights)")->check(cli::non_negative);
    app.add_option("--clip", o.clip, "gradient-norm clipping (<= 0: off)");
    app.add_option("--steps", o.steps, "optimizer updates (in all, counting those of a resumed run)")
        ->check(cli::positive);
    app.add_option("--eval-every", o.eval_every, "updates between validation losses")->check(cli::positive);
    app.add_option("--eval-batches", o.eval_batches, "validation micro-batches per evaluation")->check(cli::positive);
    app.add_flag("--eval-only", eval_only, "only print the validation loss of the model (e.g. --init-from FILE)");
    app.add_option("--seed", o.seed, "weights and sampling seed");
    auto* out_opt = app.add_option("--out", o.out, "directory for metrics.jsonl, summary.json and state.snug (empty: no files)");
    app.add_option("--resume", o.resume, "continue from a training state (a state.snug of an earlier --out)");
    app.add_option("--save-every", o.save_every, "updates between state saves into --out (0: at the end and on Ctrl-C only)")
        ->check(cli::non_negative)
        ->needs(out_opt);
    app.add_option("--stop-after", o.stop_after,
                   "stop after this update and save the state into --out, as Ctrl-C would (for time-sliced jobs; 0: never)")
        ->check(cli::non_negative)
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
    app.add_option("--sample", o.sample, "tokens to generate at the end (0: none)")->check(cli::non_negative);
    app.add_option("--prompt", o.prompt, "prompt text for the sample (default: the start of the validation data)");
    app.add_option("--temperature", o.temperature, "sampling temperature (0: greedy)")->check(cli::non_negative);
    app.add_option("--top-k", o.top_k, "sample among the k likeliest tokens (0: all)")->check(cli::non_negative);
    app.add_option("--flops-budget", o.flops_budget,
                   "model FLOPs at which 'loss at equal FLOPs' is read (0: the run's total); give two runs the same")
        ->check(cli::non_negative);
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
        ->check(cli::positive);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (ranks.rank() != 0) return e.get_exit_code() == 0 ? 0 : 2;  // rank 0 says it
        const int code = app.exit(e);
        return code == 0 ? 0 : 2;
    }
    ranks.set_timeout(rank_timeout);

    o.run.precision = parse_precision_kind(precision);
    o.run.checkpoint = parse_checkpoint_kind(checkpoint, "--checkpoint");
    o.run.moments = parse_moment_storage(optimizer_state);
    o.run.master = parse_master_storage(master);
    o.attention = parse_attention_kind(attention, "--attention");
    o.budget_bytes = vram_budget == "none" ? std::nullopt : std::optional(parse_bytes(vram_budget));
    if (batch_tokens > 0) {
        const std::int64_t bt = std::int64_t{o.run.micro_batch} * o.run.seq;
        if (batch_tokens % bt != 0)
            throw ConfigError("--batch-tokens " + std::to_string(batch_tokens) + " is not a multiple of B T = " +
                                    std::to_string(bt) + " tokens per micro-batch");
        o.run.accumulation = static_cast<int>(batch_tokens / bt);
    }
    if (eval_only && !o.resume.empty())
        throw ConfigError("--eval-only takes a model file (--init-from), not a training state");

    // An unknown --model preset, or a model file for a family that has none,
    // is refused before any device is touched.
    families(o, [&]<class Config>() {
        (void)o.shape<Config>();
        check_model_files<Config>(o);
    });
#if defined(SNUG_HAVE_NCCL)
    // One GPU per rank: this rank's, before any CUDA work.
    if (ranks.size() > 1 && device_name != "host" && cuda::device_count() > 0) dist::use_local_gpu(ranks);
#endif
    const DeviceInfo device = choose_device(device_name);
    o.attention = resolve_attention(o.attention, device);
    if (ranks.size() > 1 && run_ladder)
        throw ConfigError("--ladder runs in one process; this job has " + std::to_string(ranks.size()) +
                                " ranks: start it without mpirun");
    o.ranks = ranks.size();
    // Rank 0 reports; the others compute the same numbers and say nothing.
    // (--plan under mpirun plans one rank of the job: with --zero, its shard.)
    const std::unique_ptr<Report> report =
        ranks.rank() == 0 ? program.make_report() : std::make_unique<Report>();
    // The rest is written once for every family (--arch): Config is its
    // model's config type (train/arch.hpp).
    return families(o, [&]<class Config>() -> int {
        if (plan) return run_plan_program<Config>(o, device, *report);
        if (run_ladder) return run_ladder_program<Config>(o, ladder, device, *report);

        const std::int64_t tokens_per_update = o.run.tokens_per_update() * o.ranks;
        // A run the machine's memory cannot hold is refused before its weights are made.
        const RunInputsOf<Config> inputs =
            load_inputs<Config>(o, tokens_per_update * o.steps + 1, [&](const Config& c) {
                if (!eval_only) check_host_memory(o, c, device);
            });
        const TrainData& data = inputs.data;
        const ModelSourceOf<Config>& source = inputs.source;
        const Config& config = source.config;
        std::optional<data::Tokenizer> tokenizer;
        if (!tokenizer_path.empty()) tokenizer.emplace(tokenizer_path);
        const data::Tokenizer* decoder = tokenizer ? &*tokenizer : nullptr;

        report->device(device);
        report->model(model_summary(config), o.run.seq, source.description);
        report->data(data);
        if (eval_only)
            return visit_device(
                device, [&]<class Dev>() { return run_evaluation<Dev>(o, data, source, *report, decoder); });
        report->training_setup(o);
        report_memory_outlook(o, config, device, *report);

        install_stop_handler();
        const RunResult r = visit_device(device, [&]<class Dev>() {
#if defined(SNUG_HAVE_NCCL)
            // GPUs sum their gradients with NCCL, on the device (the training stream: Cuda{}'s).
            if constexpr (std::is_same_v<Dev, Cuda>) {
                if (ranks.size() > 1) {
                    dist::NcclCommunicator nccl(ranks, Cuda{});
                    return run_training<Dev>(o, data, source, device, *report, decoder, ranks, &nccl);
                }
            }
#endif
            return run_training<Dev>(o, data, source, device, *report, decoder, ranks);
        });
        if (!r.fit) {
            std::fflush(stdout);
            std::fprintf(stderr, "\n%s: OutOfMemory: %s\n", program.name, r.out_of_memory.c_str());
        }
        return r.exit_code;
    });
}

// The ranks of the job (mpirun, or this process alone), then the program,
// its escaped errors turned into exit codes.
template <class Families>
int train_main(int argc, char** argv, const Program& program, Families families) {
#if defined(SNUG_HAVE_MPI)
    const std::unique_ptr<dist::Ranks> ranks = dist::join_ranks(&argc, &argv);
#else
    if (dist::launched_by_mpi()) {
        std::fprintf(stderr,
                     "%s: started by mpirun, but built without MPI (libopenmpi-dev): each copy would train alone and "
                     "write the same files\n",
                     program.name);
        return 2;
    }
    const std::unique_ptr<dist::Ranks> ranks = std::make_unique<dist::SingleProcess>();
#endif
    const std::string name = ranks->size() > 1 ? std::string(program.name) + " (rank " +
                                                     std::to_string(ranks->rank()) + " of " +
                                                     std::to_string(ranks->size()) + ")"
                                               : std::string(program.name);
    return guarded_main(name.c_str(), [&] { return train_program(argc, argv, program, families, *ranks); },
                        [&](int code) { ranks->abort(code); });
}

}  // namespace detail

// GPT-2 and Llama, chosen by --arch (train_gpt).
inline int train_main(int argc, char** argv, const Program& program) {
    return detail::train_main(argc, argv, program, detail::BuiltinFamilies{});
}

// A CausalLM family of your own (nn/family.hpp), shaped by --layers and
// Family::block_shape(heads, channels).
template <class Family>
int train_main(int argc, char** argv, const Program& program) {
    static_assert(requires(int heads, int channels) {
        { Family::block_shape(heads, channels) } -> std::convertible_to<typename Family::BlockShape>;
    }, "train_main<Family>: the family needs `static BlockShape block_shape(int heads, int channels)`, the block "
       "that --heads and --channels ask for");
    return detail::train_main(argc, argv, program, detail::OneFamily<Family>{});
}

}  // namespace snug
