// Arch: the model families the training engine builds from a command line
// ("gpt2", "llama"), the one place that turns the name into the family's
// config type (visit_arch), and what differs between them when a run makes
// its model: the shape the options ask for, sized for the data's vocabulary
// and the run's context, computing as the run chooses. The engine itself
// (run.hpp, run_plan.hpp, ladder.hpp) is written over the config type and
// finds the model through model_of (nn/model_of.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/nn/attention_kind.hpp"
#include "snug/nn/gpt_config.hpp"
#include "snug/nn/llama.hpp"

namespace snug {

enum class Arch : std::uint8_t { gpt2, llama };

inline constexpr Arch all_archs[] = {Arch::gpt2, Arch::llama};

constexpr const char* arch_name(Arch a) { return a == Arch::gpt2 ? "gpt2" : "llama"; }

// "gpt2" or "llama"; anything else throws ConfigError naming the value.
inline Arch parse_arch(std::string_view s, std::string_view what = "arch") {
    for (Arch a : all_archs)
        if (s == arch_name(a)) return a;
    throw ConfigError(std::string(what) + " " + std::string(s) + ": expected gpt2 or llama");
}

// Every name, in order: what a command line accepts.
inline std::vector<std::string> arch_names() {
    std::vector<std::string> names;
    for (Arch a : all_archs) names.emplace_back(arch_name(a));
    return names;
}

// Calls f.template operator()<Config>() with the config type of `a`
// (GPTConfig, LlamaConfig).
template <class F>
auto visit_arch(Arch a, F&& f) {
    switch (a) {
        case Arch::gpt2: return f.template operator()<GPTConfig>();
        case Arch::llama: return f.template operator()<LlamaConfig>();
    }
    throw ConfigError("arch " + std::to_string(static_cast<int>(a)) + " is not one snug compiles");
}

// ---- a family's shape from a run's choices --------------------------------------------

// The shape a run asks for by name or by size: `preset` (empty: layers,
// heads and channels), vocabulary and context set later (sized_for).
//   gpt2:  GPTConfig::preset's names (124M ... 1558M, d2 ... d48)
//   llama: GaLore's Llama shapes 60M, 130M, 350M, 1B, and tiny (4 layers of
//          64, 4 heads); by size, the MLP is Llama's 8C/3 rounded up to a
//          multiple of 64
inline GPTConfig shape_for(std::type_identity<GPTConfig>, const std::string& preset, int layers, int heads,
                           int channels) {
    GPTConfig c = preset.empty() ? GPTConfig{} : GPTConfig::preset(preset);
    if (preset.empty()) {
        c.n_layer = layers;
        c.n_head = heads;
        c.channels = channels;
    }
    return c;
}

inline LlamaConfig shape_for(std::type_identity<LlamaConfig>, const std::string& preset, int layers, int heads,
                             int channels) {
    struct Size {
        const char* name;
        int layers, channels, heads, hidden;
    };
    // GaLore's shapes (their MLP widths rounded to a multiple of 64, so every
    // GEMM operand stays 16-byte aligned in 16-bit types).
    constexpr Size sizes[] = {{"tiny", 4, 64, 4, 192},
                              {"60M", 8, 512, 8, 1408},
                              {"130M", 12, 768, 12, 2048},
                              {"350M", 24, 1024, 16, 2752},
                              {"1B", 24, 2048, 32, 5504}};
    if (preset.empty()) return make_llama_config(1, 1, layers, channels, heads);
    for (const Size& s : sizes)
        if (preset == s.name) return make_llama_config(1, 1, s.layers, s.channels, s.heads, s.hidden);
    throw ConfigError("unknown Llama preset '" + preset + "' (valid: tiny, 60M, 130M, 350M, 1B)");
}

// A family of your own (train_main<Family>): `layers` blocks of
// Family::block_shape(heads, channels); it has no presets.
template <class Family>
    requires requires(int h, int c) { Family::block_shape(h, c); }
CausalLMConfig<Family> shape_for(std::type_identity<CausalLMConfig<Family>>, const std::string& preset, int layers,
                                 int heads, int channels) {
    if (!preset.empty())
        throw ConfigError("--model " + preset + ": this family has no presets; give --layers, --heads and --channels");
    CausalLMConfig<Family> c{};
    c.n_layer = layers;
    c.block = Family::block_shape(heads, channels);
    return c;
}

// The shape with a vocabulary of `vocab` tokens (padded as the family pads)
// and a context of `context` positions.
inline GPTConfig sized_for(GPTConfig c, int vocab, int context) { return c.with_vocab(vocab).with_context(context); }

template <class Family>
CausalLMConfig<Family> sized_for(CausalLMConfig<Family> c, int vocab, int context) {
    c.vocab_size = vocab;
    c.padded_vocab_size = CausalLMConfig<Family>::pad_vocab(vocab);
    c.max_seq_len = context;
    return c;
}

// The model computing as a run asks: its attention kind and classifier chunk
// (not part of the shape: they change memory and rounding only).
inline GPTConfig with_run_choices(GPTConfig c, AttentionKind attention, std::int64_t classifier_chunk) {
    c.attention = attention;
    c.classifier_chunk = classifier_chunk;
    return c;
}

template <class Family>
CausalLMConfig<Family> with_run_choices(CausalLMConfig<Family> c, AttentionKind attention,
                                        std::int64_t classifier_chunk) {
    if constexpr (requires { c.block.attention; }) c.block.attention = attention;
    c.classifier_chunk = classifier_chunk;
    return c;
}

// Throws ConfigError naming the first value of `c` the model would refuse,
// before anything of its size is made (a CausalLM checks its config as its
// Meter twin is built, which allocates nothing).
inline void validate_config(const GPTConfig& c) { c.validate(); }

template <class Family>
void validate_config(const CausalLMConfig<Family>& c) {
    MemoryTracker tracker;
    (void)CausalLM<Family, float, Meter>(c, tracker);
}

}  // namespace snug
