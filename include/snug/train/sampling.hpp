// Sampling from a model being trained: the next token from its logits
// (temperature, top-k), a continuation of a prompt, and the sample a run
// reports at its end, decoded as bytes or through an llm.c tokenizer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/core/memory.hpp"
#include "snug/core/rng.hpp"
#include "snug/data/tokenizer.hpp"
#include "snug/train/data_source.hpp"
#include "snug/train/options.hpp"
#include "snug/train/report.hpp"
#include "snug/train/session.hpp"

namespace snug {

// Draws the next token from logits (vocab): greedy for temperature <= 0, else
// softmax(logits / temperature) restricted to the top_k largest (top_k <= 0: all).
inline int sample_token(const std::vector<float>& logits, float temperature, int top_k, Generator& rng) {
    const int V = static_cast<int>(logits.size());
    if (temperature <= 0.0f)
        return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    std::vector<int> order(static_cast<std::size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    const int k = top_k > 0 ? std::min(top_k, V) : V;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int b) { return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)]; });
    const double top = logits[static_cast<std::size_t>(order[0])];
    std::vector<double> weights(static_cast<std::size_t>(k));
    double sum = 0.0;
    for (int i = 0; i < k; ++i) {
        weights[static_cast<std::size_t>(i)] =
            std::exp((logits[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] - top) / temperature);
        sum += weights[static_cast<std::size_t>(i)];
    }
    double u = static_cast<double>(rng.uniform()) * sum;
    for (int i = 0; i < k; ++i) {
        u -= weights[static_cast<std::size_t>(i)];
        if (u < 0.0) return order[static_cast<std::size_t>(i)];
    }
    return order[static_cast<std::size_t>(k - 1)];
}

// The length of the well-formed UTF-8 sequence of a printable character at
// the start of `s` (not empty; Unicode's table 3-7: no overlong forms, no
// surrogates, nothing past U+10FFFF), or 0: a byte that starts no such
// sequence, an ASCII control character other than '\n', DEL, or a C1 control
// (U+0080 .. U+009F, which some terminals obey).
inline std::size_t printable_char_length(std::string_view s) {
    const auto at = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
    const unsigned char c = at(0);
    if (c < 0x80) return c == '\n' || (c >= 0x20 && c < 0x7f) ? 1 : 0;
    std::size_t n = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        if (c == 0xc2) lo = 0xa0;  // C1 controls
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else {
        return 0;
    }
    if (s.size() < n || at(1) < lo || at(1) > hi) return 0;
    for (std::size_t i = 2; i < n; ++i) {
        if (at(i) < 0x80 || at(i) > 0xbf) return 0;
    }
    return n;
}

// Text safe to print: printable ASCII, '\n' and well-formed UTF-8 pass
// through; every other byte (control characters, bytes of a broken or
// truncated sequence, as an untrained byte-level model samples) becomes
// \xNN, so a sample never writes raw control or invalid bytes to a terminal.
inline std::string printable(std::string_view bytes) {
    std::string out;
    for (std::size_t i = 0; i < bytes.size();) {
        const std::size_t n = printable_char_length(bytes.substr(i));
        if (n > 0) {
            out += bytes.substr(i, n);
            i += n;
        } else {
            constexpr std::string_view hex = "0123456789abcdef";
            const auto c = static_cast<unsigned char>(bytes[i++]);
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 15];
        }
    }
    return out;
}

// Token ids as text: bytes through printable(); ids through the llm.c
// tokenizer when there is one (then printable()), else as numbers.
inline std::string render_tokens(const std::vector<std::int32_t>& tokens, bool bytes,
                                 const data::Tokenizer* tokenizer) {
    if (bytes) {
        std::string raw;
        for (std::int32_t t : tokens) raw += static_cast<char>(static_cast<unsigned char>(t));
        return printable(raw);
    }
    if (tokenizer != nullptr) return printable(tokenizer->decode(tokens));
    std::string out;
    for (std::int32_t t : tokens) {
        if (!out.empty()) out += ' ';
        out += std::to_string(t);
    }
    return out;
}

// The n tokens that follow `tokens` (the prompt), sampled one forward pass
// at a time over the last max_seq_len tokens; o gives the seed, temperature
// and top-k; vocab: the real vocabulary (the padded rows are never drawn).
template <class Model, class Dev>
std::vector<std::int32_t> generate(Model& model, Session<Dev>& s, std::vector<std::int32_t> tokens, int n,
                                   const TrainOptions& o, int vocab) {
    const int max_T = model.config().max_seq_len;
    const int Vp = model.config().padded_vocab_size;
    Buffer<std::int32_t, Dev> window(s.tracker, MemoryCategory::workspace,
                                           static_cast<std::size_t>(max_T), "sampling window");
    Generator rng(o.seed, /*offset=*/0x5a3e);
    using Act = typename Model::value_type;
    std::vector<Act> row(static_cast<std::size_t>(Vp));
    std::vector<float> logits(static_cast<std::size_t>(vocab));
    const std::size_t prompt = tokens.size();
    for (int i = 0; i < n; ++i) {
        const int T = static_cast<int>(std::min<std::size_t>(tokens.size(), static_cast<std::size_t>(max_T)));
        upload(s.ctx.device, window.data(), tokens.data() + (tokens.size() - static_cast<std::size_t>(T)), T);
        model.forward_last(s.ctx, window.data(), 1, T);
        download(s.ctx.device, row.data(), model.logits().data(), Vp);  // (1, 1, Vp)
        model.release(s.ctx);
        for (int v = 0; v < vocab; ++v) logits[static_cast<std::size_t>(v)] = static_cast<float>(row[static_cast<std::size_t>(v)]);
        tokens.push_back(sample_token(logits, o.temperature, o.top_k, rng));
    }
    return std::vector<std::int32_t>(tokens.begin() + static_cast<std::ptrdiff_t>(prompt), tokens.end());
}

// The sample at the end: from --prompt (byte data) or the start of the
// validation data, decoded by the llm.c tokenizer when token data has one.
template <class Model, class Dev>
Sample generate_sample(Model& model, Session<Dev>& s, const TrainOptions& o, const TrainData& data,
                       const data::Tokenizer* tokenizer) {
    std::vector<std::int32_t> prompt;
    if (!o.prompt.empty()) {
        if (!data.bytes)
            throw ConfigError("--prompt needs byte-level data (builtin or text:); token data samples "
                                    "start from the validation tokens");
        for (const char c : o.prompt) prompt.push_back(static_cast<unsigned char>(c));
    } else {
        const std::size_t k = std::min<std::size_t>(8, data.val.size());
        prompt.assign(data.val.begin(), data.val.begin() + static_cast<std::ptrdiff_t>(k));
    }
    const auto out = generate(model, s, prompt, o.sample, o, data.vocab);
    const std::string shown_prompt = render_tokens(prompt, data.bytes, tokenizer);
    // Prompt and continuation decoded as one, so a character split between them prints whole.
    std::vector<std::int32_t> all = prompt;
    all.insert(all.end(), out.begin(), out.end());
    const std::string text = render_tokens(all, data.bytes, tokenizer);
    return {o.temperature, o.top_k, shown_prompt, text};
}


}  // namespace snug
