// TrainOptions: everything one GPT training run is asked to do, as a plain
// struct — the engine's input (snug/train/run.hpp). A program fills it from
// its command line (examples/train_gpt parses one with CLI11; the library
// parses none), from a config file, or in code.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "snug/nn/gpt_config.hpp"
#include "snug/train/arch.hpp"
#include "snug/train/run_spec.hpp"

namespace snug {

struct TrainOptions {
    // The model: its family, a preset, a shape, or a file (init_from: llm.c .bin or a Hugging Face
    // GPT-2 directory).
    Arch arch = Arch::gpt2;   // the family (train/arch.hpp)
    std::string model;        // preset name (d12, 124M, ...; Llama: tiny, 60M, ...); empty: layers / heads / channels
    int layers = 2, heads = 4, channels = 128;
    int kv_heads = 0;         // grouped-query attention's key/value heads (llama; 0: as many as heads)
    int vocab = 0;            // the model's vocabulary (0: the data's; more: e.g. GPT-2's 50257 on the built-in data)
    std::string init_from;
    AttentionKind attention = AttentionKind::flash;  // how the model's attention computes (any model source)
    std::int64_t classifier_chunk = 0;  // tokens per chunk of the head and loss (0: automatic; any model source)
    // What decides memory and speed.
    RunSpec run{};
    std::optional<std::size_t> budget_bytes = std::size_t{12} << 30;  // the tracker's budget (nullopt: none)
    // The optimisation.
    float lr = 3e-3f;
    int warmup = 20;
    float min_lr_frac = 0.1f;
    float weight_decay = 0.1f;
    float clip = 1.0f;
    int steps = 1000;
    std::uint64_t seed = 1337;
    // Data and evaluation.
    std::string data = "builtin";  // builtin, text:PATH (bytes) or tokens:GLOB (llm.c token files)
    std::string val;               // tokens:GLOB validation data for tokens: (empty: the last 10% of data)
    int alphabet = 8;              // characters of the built-in corpus
    int eval_every = 100;
    int eval_batches = 4;
    // Files.
    std::string out;          // metrics.jsonl, summary.json, state.snug
    std::string resume;       // a training-state file to continue from
    int save_every = 0;       // updates between state saves (0: at the end and on a stop only)
    int stop_after = 0;       // stop (and save) after this update, as Ctrl-C would (0: run to steps)
    std::string save_model;   // llm.c model file written at the end
    std::string model_dtype = "fp32";  // its parameters: fp32 (version 3) or bf16 (version 5)
    std::string export_hf;    // directory for model.safetensors + config.json
    // Sampling.
    int sample = 256;         // tokens generated at the end (0: none)
    std::string prompt;       // byte data only (empty: the start of the validation data)
    float temperature = 0.8f;
    int top_k = 0;
    // Data parallel: the job's ranks (set by the program from its launcher,
    // dist::Ranks::size(), not by a flag), each with micro-batch run.micro_batch.
    int ranks = 1;
    bool zero = false;  // ZeRO-1: the optimizer's state sharded across the ranks
    // Reporting.
    double flops_budget = 0.0;  // model FLOPs at which "loss at equal FLOPs" is read (0: the run's total)

    // The ranks the optimizer's state is sharded over: the job's under
    // --zero, which a job of one rank refuses; else 1.
    int zero_ranks() const {
        if (zero && ranks < 2)
            throw ConfigError("--zero shards the optimizer's state across data-parallel ranks, and this job has one; "
                              "start it with mpirun -np N (N >= 2)");
        return zero ? ranks : 1;
    }

    // Where the training state goes: out/state.snug (none without out).
    std::string state_path() const {
        return out.empty() ? std::string() : (std::filesystem::path(out) / "state.snug").string();
    }
    // The shape asked for, of the family `Config` (GPTConfig, LlamaConfig:
    // train/arch.hpp): the preset, or layers / heads / channels (vocabulary
    // and context come later), computing as with_choices says.
    template <class Config = GPTConfig>
    Config shape() const {
        Config c = shape_for(std::type_identity<Config>{}, model, layers, heads, channels);
        if constexpr (requires { c.block.kv_heads; }) {
            if (kv_heads > 0) c.block.kv_heads = kv_heads;
        } else if (kv_heads > 0) {
            throw ConfigError("--kv-heads " + std::to_string(kv_heads) + ": this family's attention has no "
                              "key/value heads to group (grouped-query attention is the llama family's)");
        }
        return with_choices(std::move(c));
    }

    // A model (fresh, or read from a file) computing as this run asks: its
    // attention kind and classifier chunk, which are not part of the shape.
    template <class Config>
    Config with_choices(Config c) const {
        return with_run_choices(std::move(c), attention, classifier_chunk);
    }
};

}  // namespace snug
