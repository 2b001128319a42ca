// What the command lines of train_gpt and vram_ladder share (CLI11): the
// model's shape options, and checks on numbers whose refusals say what was
// wanted. CLI11 2.1's PositiveNumber refuses 0 as "Value 0 not in range
// 0.000000 to 17976931348623157...", which reads as if 0 were allowed.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <string>

#include "snug/train/options.hpp"

namespace snug_examples {

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

// The model's shape options; returns --model, which the shape options exclude.
inline CLI::Option* add_model_options(CLI::App& app, snug::TrainOptions& o) {
    auto* model_opt = app.add_option("--model", o.model, "preset: d2 d4 d6 d12 d24 d36 d48 124M 350M 774M 1558M");
    app.add_option("--layers", o.layers, "layers (without --model)")->excludes(model_opt)->check(positive);
    app.add_option("--heads", o.heads, "attention heads (without --model)")->excludes(model_opt)->check(positive);
    app.add_option("--channels", o.channels, "channels (without --model)")->excludes(model_opt)->check(positive);
    app.add_option("--vocab", o.vocab, "the model's vocabulary (0: the data's; e.g. 50257 for GPT-2's shape on any data)")
        ->check(non_negative);
    return model_opt;
}

}  // namespace snug_examples
