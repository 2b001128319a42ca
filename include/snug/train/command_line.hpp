// What snug's command lines share (CLI11; a program of your own that uses
// CLI11 may too): the model's shape options, checks on numbers whose refusals
// say what was wanted, and checks that run the library's own parsers, so a
// command line accepts exactly the names snug compiles and refuses with the
// library's words. (CLI11 2.1's PositiveNumber refuses 0 as "Value 0 not in
// range 0.000000 to 17976931348623157...", which reads as if 0 were allowed.)
// Only programs include this header; nothing else in snug needs CLI11.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/train/options.hpp"

namespace snug::cli {

// A check that the option's value is a number above 0 (or, with zero_too,
// at least 0): "--batch: 0 is not above 0".
inline CLI::Validator number_check(bool zero_too) {
    return CLI::Validator(
        [zero_too](std::string& text) -> std::string {
            double x = 0.0;
            if (!CLI::detail::lexical_cast(text, x) || !std::isfinite(x)) return text + " is not a finite number";
            if (zero_too ? x >= 0.0 : x > 0.0) return {};
            return text + (zero_too ? " is below 0" : " is not above 0");
        },
        zero_too ? "NUMBER >= 0" : "NUMBER > 0");
}
inline const CLI::Validator positive = number_check(false);
inline const CLI::Validator non_negative = number_check(true);

// A check that runs `parse` (one of the library's parse_* functions) on the
// value: accepted when it parses, refused with its ConfigError's message
// ("precision 'fp8': expected fp32, bf16 or fp16") when it does not.
// `choices` is what --help shows.
template <class Parse>
CLI::Validator parsed_by(Parse parse, std::string choices) {
    return CLI::Validator(
        [parse](std::string& text) -> std::string {
            try {
                (void)parse(text);
                return {};
            } catch (const ConfigError& e) {
                return e.what();
            }
        },
        std::move(choices));
}

// "a|b|c": a list of names as --help shows the choices.
inline std::string choices(const std::vector<std::string>& names) {
    std::string text;
    for (const std::string& n : names) text += (text.empty() ? "" : "|") + n;
    return text;
}

// The model's shape options; returns --model, which the shape options
// exclude. by_arch: the program trains GPT-2 and Llama, chosen by --arch
// (false: one family of its own, which --model's presets do not name).
inline CLI::Option* add_model_options(CLI::App& app, snug::TrainOptions& o, bool by_arch = true) {
    if (by_arch)
        app.add_option_function<std::string>(
               "--arch", [&o](const std::string& s) { o.arch = parse_arch(s, "--arch"); },
               "the model's family: gpt2 (GPT-2: learned positions, LayerNorm, GELU MLP, tied head) or llama "
               "(RoPE, RMSNorm, SwiGLU MLP, untied head)")
            ->check(parsed_by([](const std::string& s) { return parse_arch(s, "--arch"); }, choices(arch_names())))
            ->default_str("gpt2");
    auto* model_opt = app.add_option("--model", o.model,
                                     by_arch ? "preset: gpt2: d2 d4 d6 d12 d24 d36 d48 124M 350M 774M 1558M; "
                                               "llama: tiny 60M 130M 350M 1B"
                                             : "preset (this program's family has none)");
    app.add_option("--layers", o.layers, "layers (without --model)")->excludes(model_opt)->check(positive);
    app.add_option("--heads", o.heads, "attention heads (without --model)")->excludes(model_opt)->check(positive);
    app.add_option("--kv-heads", o.kv_heads,
                   "key/value heads of grouped-query attention (llama; --heads a multiple of it; default: as many "
                   "as heads)")
        ->check(positive);
    app.add_option("--channels", o.channels, "channels (without --model)")->excludes(model_opt)->check(positive);
    app.add_option("--vocab", o.vocab, "the model's vocabulary (0: the data's; e.g. 50257 for GPT-2's shape on any data)")
        ->check(non_negative);
    return model_opt;
}

}  // namespace snug::cli
