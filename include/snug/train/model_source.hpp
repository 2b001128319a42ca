// Where a run's model comes from: its config and the fp32 weights it starts
// with — a fresh initialisation of the asked-for shape (any family the engine
// builds: train/arch.hpp), or, for GPT-2, an llm.c model file or a Hugging
// Face GPT-2 directory (model.safetensors + config.json).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/io/hf_export.hpp"
#include "snug/io/hf_llama.hpp"
#include "snug/io/llmc_model.hpp"
#include "snug/meter/device.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/nn/model_of.hpp"
#include "snug/nn/model_summary.hpp"
#include "snug/train/arch.hpp"
#include "snug/train/data_source.hpp"
#include "snug/train/host_allocation.hpp"
#include "snug/train/options.hpp"

namespace snug {

// The config and the fp32 weights a run starts from.
template <class Config>
struct ModelSourceOf {
    Config config;
    std::vector<float> weights;  // (P) in the model's parameter order (GPT: llm.c's)
    std::string description;
};
using ModelSource = ModelSourceOf<GPTConfig>;

// An llm.c model file, or a Hugging Face GPT-2 directory (model.safetensors
// + config.json): its shape and fp32 weights.
inline ModelSource read_model_file(const std::string& path) {
    const bool directory = std::filesystem::is_directory(path);
    std::error_code ec;  // a missing file is the reader's to report, by name
    const auto size = directory ? 0 : std::filesystem::file_size(path, ec);
    const std::size_t bytes = ec ? 0 : static_cast<std::size_t>(size);
    return name_allocation("the weights of " + path, bytes, [&]() -> ModelSource {
        if (directory) {
            auto hf = io::import_hf_gpt2(path);
            return {hf.config, std::move(hf.weights), "Hugging Face GPT-2 directory " + path};
        }
        auto file = io::read_llmc_model(path);
        return {file.config, std::move(file.weights), "llm.c model file " + path};
    });
}

// A family's name from its config type alone: "gpt2", "llama", a user's
// Family::name; empty when the family gives none.
inline std::string family_name(std::type_identity<GPTConfig>) { return "gpt2"; }

template <class Family>
std::string family_name(std::type_identity<CausalLMConfig<Family>>) {
    if constexpr (requires { Family::name; }) return std::string(Family::name);
    return {};
}

// "a llama model": what a run of family `Config` trains, in words.
template <class Config>
std::string family_in_words() {
    const std::string name = family_name(std::type_identity<Config>{});
    return name.empty() ? "a model of this program's family" : "a " + name + " model";
}

// A Hugging Face Llama directory (config.json + model.safetensors, or its
// shards): its shape and fp32 weights.
inline ModelSourceOf<LlamaConfig> read_llama_directory(const std::string& path) {
    std::size_t bytes = 0;  // the files', which are read whole (an estimate of what is asked for)
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(path, ec))
        if (entry.path().extension() == ".safetensors") {
            const auto n = entry.file_size(ec);
            if (!ec) bytes += static_cast<std::size_t>(n);
        }
    return name_allocation("the weights of " + path, bytes, [&]() -> ModelSourceOf<LlamaConfig> {
        io::HFLlama hf = io::import_hf_llama(path);
        return {hf.config, std::move(hf.weights), "Hugging Face Llama directory " + path};
    });
}

// The model file `path` of family `Config`.
template <class Config>
ModelSourceOf<Config> read_model_file_of(const std::string& path) {
    if constexpr (std::is_same_v<Config, LlamaConfig>)
        return read_llama_directory(path);
    else
        return read_model_file(path);
}

// Whether snug reads model files of family `Config` (--init-from): llm.c
// and Hugging Face GPT-2 files, Hugging Face Llama directories.
template <class Config>
inline constexpr bool reads_model_files = std::is_same_v<Config, GPTConfig> || std::is_same_v<Config, LlamaConfig>;

// Refuses, by flag, what a run of family `Config` cannot do: llm.c model
// files hold a GPT-2; snug reads and writes Hugging Face GPT-2 and Llama
// directories. Nothing to refuse for GPT-2.
template <class Config>
void check_model_files(const TrainOptions& o) {
    if constexpr (!std::is_same_v<Config, GPTConfig>) {
        const std::string family = family_in_words<Config>();
        auto refuse = [&](const std::string& flag, const std::string& value, const std::string& files) {
            if (!value.empty())
                throw ConfigError(flag + " " + value + ": " + files + ", and this run trains " + family +
                                  "; it starts from a fresh model and keeps its training state (--out)");
        };
        refuse("--save-model", o.save_model, "llm.c files hold a GPT-2");
        if constexpr (!reads_model_files<Config>)
            refuse("--init-from", o.init_from, "snug reads model files of a GPT-2 or a Llama");
        if constexpr (!std::is_same_v<Config, LlamaConfig>)
            refuse("--export-hf", o.export_hf, "snug writes Hugging Face files of a GPT-2 or a Llama");
    }
}

// A fresh model of `config`: its family's initialisation from `seed` (GPT-2's
// for a GPT; each tensor's declared Init for a CausalLM), drawn through its
// Meter twin so nothing of the model's size exists but the weights.
template <class Config>
ModelSourceOf<Config> fresh_model(const Config& config, std::uint64_t seed) {
    ModelSourceOf<Config> m;
    m.config = config;
    MemoryTracker tracker;
    const model_of<Config, float, Meter> shape_only(config, tracker);
    const auto P = static_cast<std::size_t>(shape_only.num_parameters());
    m.weights = name_allocation("the initial fp32 weights of a " + std::to_string(P) + "-parameter model",
                                P * sizeof(float), [&] { return shape_only.initial_weights(seed); });
    const std::string family = family_name(std::type_identity<Config>{});
    m.description = "fresh (" + (family == "gpt2" ? std::string("GPT-2") : family.empty() ? "the family's" : family) +
                    " initialisation, seed " + std::to_string(seed) + ")";
    return m;
}

// Checks a model read from o.init_from against the run: the data's
// vocabulary and the sequence length must fit it.
template <class Config>
void check_model_file(const TrainOptions& o, const Config& c, int data_vocab) {
    if (data_vocab > c.vocab_size)
        throw ConfigError("--init-from " + o.init_from + ": the model's vocabulary has " +
                          std::to_string(c.vocab_size) + " tokens but the data's has " + std::to_string(data_vocab));
    if (o.run.seq > c.max_seq_len)
        throw ConfigError("--seq " + std::to_string(o.run.seq) + " is longer than the context of " + o.init_from +
                          " (" + std::to_string(c.max_seq_len) + ")");
}

// Called with a run's model config once it is known and before anything of
// the model's size is made (a fresh model's weights); it may refuse the run
// by throwing (run_plan.hpp's check_host_memory does).
template <class Config>
using BeforeWeightsOf = std::function<void(const Config&)>;
using BeforeWeights = BeforeWeightsOf<GPTConfig>;

// A fresh model of the options' family and shape, sized for the data's
// vocabulary (or o.vocab, which may be larger) with a context of o.run.seq.
template <class Config>
Config fresh_config(const TrainOptions& o, int data_vocab) {
    if (o.vocab != 0 && o.vocab < data_vocab)
        throw ConfigError("--vocab " + std::to_string(o.vocab) + " is smaller than the data's vocabulary of " +
                          std::to_string(data_vocab) + " tokens");
    Config config = sized_for(o.shape<Config>(), o.vocab != 0 ? o.vocab : data_vocab, o.run.seq);
    validate_config(config);
    return config;
}

// o.init_from (an llm.c model file or a Hugging Face directory: GPT-2 only),
// else a fresh initialisation of the options' shape (fresh_config).
template <class Config = GPTConfig>
ModelSourceOf<Config> model_source(const TrainOptions& o, int data_vocab,
                                   const std::type_identity_t<BeforeWeightsOf<Config>>& before_weights = {}) {
    check_model_files<Config>(o);
    if (o.init_from.empty()) {
        const Config config = fresh_config<Config>(o, data_vocab);
        if (before_weights) before_weights(config);
        return fresh_model(config, o.seed);
    }
    if constexpr (reads_model_files<Config>) {
        if (o.vocab != 0) throw ConfigError("--vocab and --init-from: the vocabulary comes from " + o.init_from);
        ModelSourceOf<Config> m = read_model_file_of<Config>(o.init_from);
        m.config = o.with_choices(m.config);
        check_model_file(o, m.config, data_vocab);
        if (before_weights) before_weights(m.config);
        return m;
    }
    throw ConfigError("--init-from: not for this family");  // check_model_files refused it
}

// A run's data and model, read in the order that lets each check the other:
// a model file first (its vocabulary is what llm.c token ids are checked
// against), then the data; a fresh model is sized for the data, and
// `before_weights` sees its config before its weights are made (a model
// file's, once the file is checked against the data).
template <class Config>
struct RunInputsOf {
    TrainData data;
    ModelSourceOf<Config> source;
};
using RunInputs = RunInputsOf<GPTConfig>;

template <class Config = GPTConfig>
RunInputsOf<Config> load_inputs(const TrainOptions& o, std::int64_t train_tokens_needed,
                                const std::type_identity_t<BeforeWeightsOf<Config>>& before_weights = {}) {
    check_model_files<Config>(o);
    RunInputsOf<Config> in;
    if (o.init_from.empty()) {
        in.data = load_data(o, train_tokens_needed, token_data_vocab(o));
        in.source = model_source<Config>(o, in.data.vocab, before_weights);
        return in;
    }
    if constexpr (reads_model_files<Config>) {
        if (o.vocab != 0) throw ConfigError("--vocab and --init-from: the vocabulary comes from " + o.init_from);
        in.source = read_model_file_of<Config>(o.init_from);
        in.source.config = o.with_choices(in.source.config);
        in.data = load_data(o, train_tokens_needed, token_data_vocab(o, in.source.config.vocab_size));
        check_model_file(o, in.source.config, in.data.vocab);
        if (before_weights) before_weights(in.source.config);
    }
    return in;
}

}  // namespace snug
