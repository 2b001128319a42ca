// AttentionKind: how a model's attention computes — flash attention (the
// default: tiled, keeps one log-sum-exp per row, ops/flash_attention.hpp) or
// the materialised kernel that stores the (B, NH, T, T) probabilities (kept
// for comparison). Both give the same result within rounding; the choice
// decides memory and speed only.
#pragma once

#include <string>
#include <string_view>

#include "snug/core/error.hpp"

namespace snug {

enum class AttentionKind : unsigned char { flash, materialized };

// The name a command line and the state file use: "flash" or "materialized".
constexpr const char* attention_kind_name(AttentionKind k) {
    return k == AttentionKind::flash ? "flash" : "materialized";
}

// "flash" or "materialized"; anything else throws ConfigError naming the
// value (`what` starts the message: a program passes its flag).
inline AttentionKind parse_attention_kind(std::string_view s, std::string_view what = "attention") {
    for (AttentionKind k : {AttentionKind::flash, AttentionKind::materialized})
        if (s == attention_kind_name(k)) return k;
    throw ConfigError(std::string(what) + " " + std::string(s) + ": expected flash or materialized");
}

}  // namespace snug
