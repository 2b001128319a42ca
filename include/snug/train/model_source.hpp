// Where a run's model comes from: its shape and the fp32 weights it starts
// with — a fresh GPT-2 initialisation of the asked-for shape, an llm.c model
// file, or a Hugging Face GPT-2 directory (model.safetensors + config.json).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/io/hf_export.hpp"
#include "snug/io/llmc_model.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/train/data_source.hpp"
#include "snug/train/host_allocation.hpp"
#include "snug/train/options.hpp"

namespace snug {

// The shape and the fp32 weights a run starts from.
struct ModelSource {
    GPTConfig config;
    std::vector<float> weights;  // (P) in the llm.c parameter order
    std::string description;
};

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

// A fresh model of `config`: GPT-2's initialisation from `seed`.
inline ModelSource fresh_model(const GPTConfig& config, std::uint64_t seed) {
    ModelSource m;
    m.config = config;
    const auto P = static_cast<std::size_t>(config.num_parameters());
    m.weights = name_allocation("the initial fp32 weights of a " + std::to_string(P) + "-parameter model",
                                P * sizeof(float), [&] { return gpt_initial_weights(config, seed); });
    m.description = "fresh (GPT-2 initialisation, seed " + std::to_string(seed) + ")";
    return m;
}

// Checks a model read from o.init_from against the run: the data's
// vocabulary and the sequence length must fit it.
inline void check_model_file(const TrainOptions& o, const GPTConfig& c, int data_vocab) {
    if (data_vocab > c.vocab_size)
        throw ConfigError("--init-from " + o.init_from + ": the model's vocabulary has " +
                          std::to_string(c.vocab_size) + " tokens but the data's has " + std::to_string(data_vocab));
    if (o.run.seq > c.max_seq_len)
        throw ConfigError("--seq " + std::to_string(o.run.seq) + " is longer than the context of " + o.init_from +
                          " (" + std::to_string(c.max_seq_len) + ")");
}

// Called with a run's model shape once it is known and before anything of
// the model's size is made (a fresh model's weights); it may refuse the run
// by throwing (run_plan.hpp's check_host_memory does).
using BeforeWeights = std::function<void(const GPTConfig&)>;

// o.init_from (an llm.c model file or a Hugging Face directory), else a fresh
// GPT-2 initialisation of the options' shape sized for the data's vocabulary
// (or o.vocab, which may be larger) with a context of o.run.seq.
inline ModelSource model_source(const TrainOptions& o, int data_vocab, const BeforeWeights& before_weights = {}) {
    if (o.init_from.empty()) {
        if (o.vocab != 0 && o.vocab < data_vocab)
            throw ConfigError("--vocab " + std::to_string(o.vocab) + " is smaller than the data's vocabulary of " +
                              std::to_string(data_vocab) + " tokens");
        GPTConfig config = o.shape().with_vocab(o.vocab != 0 ? o.vocab : data_vocab).with_context(o.run.seq);
        config.validate();
        if (before_weights) before_weights(config);
        return fresh_model(config, o.seed);
    }
    if (o.vocab != 0) throw ConfigError("--vocab and --init-from: the vocabulary comes from " + o.init_from);
    ModelSource m = read_model_file(o.init_from);
    m.config = o.with_choices(m.config);
    check_model_file(o, m.config, data_vocab);
    if (before_weights) before_weights(m.config);
    return m;
}

// A run's data and model, read in the order that lets each check the other:
// a model file first (its vocabulary is what llm.c token ids are checked
// against), then the data; a fresh model is sized for the data, and
// `before_weights` sees its shape before its weights are made (a model
// file's, once the file is checked against the data).
struct RunInputs {
    TrainData data;
    ModelSource source;
};

inline RunInputs load_inputs(const TrainOptions& o, std::int64_t train_tokens_needed,
                             const BeforeWeights& before_weights = {}) {
    RunInputs in;
    if (o.init_from.empty()) {
        in.data = load_data(o, train_tokens_needed, token_data_vocab(o));
        in.source = model_source(o, in.data.vocab, before_weights);
        return in;
    }
    if (o.vocab != 0) throw ConfigError("--vocab and --init-from: the vocabulary comes from " + o.init_from);
    in.source = read_model_file(o.init_from);
    in.source.config = o.with_choices(in.source.config);
    in.data = load_data(o, train_tokens_needed, token_data_vocab(o, in.source.config.vocab_size));
    check_model_file(o, in.source.config, in.data.vocab);
    if (before_weights) before_weights(in.source.config);
    return in;
}

}  // namespace snug
