// Where a run's tokens come from: the built-in synthetic corpus, a text file
// as bytes, or llm.c token files, each split into training and validation
// tokens with a line saying what was read. Token ids are checked against the
// vocabulary of the model they will feed (GPT-2's 50,257 unless the run says
// otherwise), so a file written for another tokenizer fails naming the file,
// the id and the vocabulary.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/data/loader.hpp"
#include "snug/data/synthetic_corpus.hpp"
#include "snug/data/text_file.hpp"
#include "snug/data/token_file.hpp"
#include "snug/train/options.hpp"

namespace snug {

// A run's data.
struct TrainData {
    std::vector<std::int32_t> train, val;
    int vocab = 256;
    bool bytes = true;                // tokens are bytes: samples print as text
    std::optional<double> floor;      // exact loss floor (built-in corpus)
    std::string description;
};

inline constexpr int gpt2_vocab = 50257;

inline bool is_token_data(const TrainOptions& o) { return o.data.rfind("tokens:", 0) == 0; }

// The vocabulary llm.c token files are checked against: the model's when it
// comes from a file (init_vocab > 0), else --vocab, else GPT-2's.
inline int token_data_vocab(const TrainOptions& o, int init_vocab = 0) {
    if (init_vocab > 0) return init_vocab;
    return o.vocab != 0 ? o.vocab : gpt2_vocab;
}

// Every file matching `pattern`, in name order, each id checked to be < vocab.
inline std::vector<std::int32_t> read_token_glob(const std::string& pattern, int vocab) {
    std::vector<std::int32_t> all;
    for (const auto& path : data::expand_glob(pattern)) {
        const auto part = data::read_token_file(path, vocab);
        all.insert(all.end(), part.begin(), part.end());
    }
    return all;
}

// The options' data: enough training tokens for `train_tokens_needed` (the
// built-in corpus; files are read whole), validation tokens for
// eval_batches micro-batches. token_vocab: what token-file ids are checked
// against (token_data_vocab). Throws ConfigError for a source it does not know.
inline TrainData load_data(const TrainOptions& o, std::int64_t train_tokens_needed, int token_vocab = gpt2_vocab) {
    TrainData d;
    const int B = o.run.micro_batch * o.ranks, T = o.run.seq;  // every rank's sequences
    const std::int64_t val_needed = std::int64_t{o.eval_batches} * B * T + 1;
    if (o.data == "builtin") {
        data::SyntheticCorpusConfig corpus_config;
        corpus_config.alphabet = o.alphabet;
        const data::SyntheticCorpus corpus(corpus_config);
        // Enough for every update once (the loader wraps after), at most 16M tokens.
        d.train = corpus.generate(std::min<std::int64_t>(train_tokens_needed, std::int64_t{16} << 20), 0);
        d.val = corpus.generate(val_needed, 1);
        d.vocab = corpus.vocab_size();
        d.floor = corpus.window_floor(T);
        char line[200];
        std::snprintf(line, sizeof line,
                      "built-in synthetic corpus (order-2 Markov, %d characters, entropy rate %.4f nats/token; "
                      "floor at T = %d: %.4f)",
                      corpus.alphabet(), corpus.entropy_rate(), T, *d.floor);
        d.description = line;
    } else if (o.data.rfind("text:", 0) == 0) {
        const std::string path = o.data.substr(5);
        const auto tokens = data::read_text_file(path);
        auto split = data::split_train_val(tokens, 0.1, "text file " + path);
        d.train = std::move(split.train);
        d.val = std::move(split.val);
        d.vocab = data::byte_vocab_size;
        d.description = "text file " + path + " as bytes (" + std::to_string(tokens.size()) +
                        " tokens; the last 10% for validation)";
    } else if (is_token_data(o)) {
        const std::string pattern = o.data.substr(7);
        d.vocab = token_vocab;
        d.bytes = false;
        d.train = read_token_glob(pattern, d.vocab);
        if (!o.val.empty()) {
            if (o.val.rfind("tokens:", 0) != 0) throw ConfigError("--val " + o.val + ": expected tokens:GLOB");
            d.val = read_token_glob(o.val.substr(7), d.vocab);
            d.description = "llm.c token files " + pattern + " (" + std::to_string(d.train.size()) +
                            " tokens), validation " + o.val.substr(7) + " (" + std::to_string(d.val.size()) +
                            " tokens)";
        } else {
            auto split = data::split_train_val(d.train, 0.1, "llm.c token files " + pattern);
            d.train = std::move(split.train);
            d.val = std::move(split.val);
            d.description = "llm.c token files " + pattern + " (the last 10% for validation)";
        }
    } else {
        throw ConfigError("--data " + o.data + ": expected builtin, text:PATH or tokens:GLOB");
    }
    if (!o.val.empty() && !is_token_data(o))
        throw ConfigError("--val is for --data tokens:GLOB (the other sources split off their own)");
    return d;
}

// The data's vocabulary without reading the data (for planning).
inline int data_vocab(const TrainOptions& o) {
    if (o.data == "builtin") {
        data::SyntheticCorpusConfig c;
        c.alphabet = o.alphabet;
        return data::SyntheticCorpus(c).vocab_size();
    }
    if (is_token_data(o)) return token_data_vocab(o);
    return data::byte_vocab_size;
}

}  // namespace snug
