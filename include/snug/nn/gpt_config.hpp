// GPTConfig: the shape of a GPT-2-style model (vocabulary, context, depth,
// heads, width), how its attention and classifier compute, its presets, its parameter count and
// its model FLOPs.
#pragma once

#include <climits>
#include <cstdint>
#include <string>
#include <string_view>

#include "snug/core/error.hpp"
#include "snug/nn/attention_kind.hpp"
#include "snug/nn/model_summary.hpp"

namespace snug {

struct GPTConfig {
    int vocab_size = 50257;          // V: real token ids are 0 .. V-1
    int padded_vocab_size = 50304;   // Vp >= V: rows of wte / columns of the logits (GEMM-friendly)
    int max_seq_len = 1024;          // maxT: rows of wpe
    int n_layer = 12;                // L
    int n_head = 12;                 // NH
    int channels = 768;              // C; head size C / NH
    // How attention computes (not part of the shape: either kind runs the
    // same weights to the same result within rounding).
    AttentionKind attention = AttentionKind::flash;
    // Tokens per chunk of the classifier (nn/classifier.hpp; 0: automatic).
    // Not part of the shape either: it changes memory and rounding only.
    std::int64_t classifier_chunk = 0;

    // Vp for a vocabulary: the next multiple of 128 (GPU GEMMs like it), or V
    // itself for a small vocabulary (<= 256) that would mostly be padding, and
    // for one within 127 of INT_MAX (whose padding int cannot hold).
    static int pad_vocab(int vocab) {
        return vocab <= 256 || vocab > INT_MAX - 127 ? vocab : (vocab + 127) / 128 * 128;
    }

    // GPT-2 sizes and small test models.
    //   "124M" "350M" "774M" "1558M" : GPT-2 small, medium, large, xl (also "d12" "d24" "d36" "d48")
    //   "d2" "d4" "d6"               : L = N layers, C = 64 N, NH = N heads (head size 64)
    // Vocabulary and context are GPT-2's (50257, 1024); a trainer sets its own.
    static GPTConfig preset(std::string_view name) {
        auto make = [](int L, int NH, int C) {
            GPTConfig c;
            c.n_layer = L;
            c.n_head = NH;
            c.channels = C;
            return c;
        };
        if (name == "124M" || name == "d12") return make(12, 12, 768);
        if (name == "350M" || name == "d24") return make(24, 16, 1024);
        if (name == "774M" || name == "d36") return make(36, 20, 1280);
        if (name == "1558M" || name == "d48") return make(48, 25, 1600);
        if (name == "d2") return make(2, 2, 128);
        if (name == "d4") return make(4, 4, 256);
        if (name == "d6") return make(6, 6, 384);
        throw ConfigError("unknown model preset '" + std::string(name) +
                          "' (valid: 124M, 350M, 774M, 1558M, d2, d4, d6, d12, d24, d36, d48)");
    }

    // The same model with another vocabulary (padded as pad_vocab says).
    GPTConfig with_vocab(int vocab) const {
        GPTConfig c = *this;
        c.vocab_size = vocab;
        c.padded_vocab_size = pad_vocab(vocab);
        return c;
    }

    // The same model with another maximum context.
    GPTConfig with_context(int max_seq) const {
        GPTConfig c = *this;
        c.max_seq_len = max_seq;
        return c;
    }

    // Throws ConfigError naming the first value that makes no sense.
    void validate() const {
        auto fail = [](const std::string& what) { throw ConfigError("GPT config: " + what); };
        if (vocab_size <= 0) fail("vocab_size must be positive, got " + std::to_string(vocab_size));
        if (padded_vocab_size < vocab_size)
            fail("padded_vocab_size " + std::to_string(padded_vocab_size) + " is smaller than vocab_size " +
                 std::to_string(vocab_size));
        if (max_seq_len <= 0) fail("max_seq_len must be positive, got " + std::to_string(max_seq_len));
        if (n_layer <= 0) fail("n_layer must be positive, got " + std::to_string(n_layer));
        if (n_head <= 0) fail("n_head must be positive, got " + std::to_string(n_head));
        if (classifier_chunk < 0)
            fail("classifier_chunk must be 0 (automatic) or a number of tokens, got " +
                 std::to_string(classifier_chunk));
        if (channels <= 0 || channels % n_head != 0)
            fail("channels (" + std::to_string(channels) + ") must be a positive multiple of n_head (" +
                 std::to_string(n_head) + ")");
        if (attention == AttentionKind::automatic)
            fail("attention 'auto' is a run's request: resolve it to a kind (snug::resolve_attention) first");
    }

    int head_size() const { return channels / n_head; }

    // Parameters per block: two LayerNorms (4C), QKV (3C·C + 3C), attention
    // projection (C·C + C), MLP up (4C·C + 4C) and down (4C·C + C).
    std::int64_t block_parameters() const {
        const std::int64_t C = channels;
        return 12 * C * C + 13 * C;
    }
    // All stored parameters, padded vocabulary rows included (what memory holds).
    std::int64_t num_parameters() const {
        const std::int64_t C = channels;
        return static_cast<std::int64_t>(padded_vocab_size) * C + static_cast<std::int64_t>(max_seq_len) * C +
               n_layer * block_parameters() + 2 * C;
    }

    // Model FLOPs per trained token at sequence length T (forward + backward):
    // ModelSummary::flops_per_token's convention, for this shape.
    double flops_per_token(int T) const;
};

// What reports and FLOP counts need of a GPT of this shape. Its matmul
// parameters: the head (V·C; the tied wte counts once, as the head), every
// block's, and ln_f's 2C; position embeddings and padding do no matmul work.
inline ModelSummary model_summary(const GPTConfig& c) {
    ModelSummary s;
    s.family = "gpt2";
    s.layers = c.n_layer;
    s.heads = s.kv_heads = c.n_head;
    s.channels = c.channels;
    s.context = c.max_seq_len;
    s.vocab = c.vocab_size;
    s.attention = c.attention;
    s.parameters = c.num_parameters();
    s.block_parameters = c.block_parameters();
    s.matmul_parameters = static_cast<double>(c.vocab_size) * c.channels +
                          static_cast<double>(c.n_layer) * static_cast<double>(c.block_parameters()) + 2.0 * c.channels;
    return s;
}

inline double GPTConfig::flops_per_token(int T) const { return model_summary(*this).flops_per_token(T); }

}  // namespace snug
