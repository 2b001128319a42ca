// AttentionKind: how a model's attention computes — flash attention (tiled,
// keeps one log-sum-exp per row, ops/flash_attention.hpp), the same contract
// on cuDNN's fused SDPA where the device has that engine and it takes the
// call (ops/fused_attention.hpp; snug's flash kernels otherwise), or the
// materialised kernel that stores the (B, NH, T, T) probabilities (kept for
// comparison). All give the same result within rounding; the choice decides
// memory and speed only. `automatic` is a run's request, not a model's: the
// engine resolves it to cudnn or flash before a model is built
// (train/attention_choice.hpp).
#pragma once

#include <string>
#include <string_view>

#include "snug/core/error.hpp"

namespace snug {

enum class AttentionKind : unsigned char { flash, materialized, cudnn, automatic };

// The name a command line and the state file use: "flash", "materialized",
// "cudnn" or "auto".
constexpr const char* attention_kind_name(AttentionKind k) {
    switch (k) {
        case AttentionKind::flash: return "flash";
        case AttentionKind::materialized: return "materialized";
        case AttentionKind::cudnn: return "cudnn";
        case AttentionKind::automatic: return "auto";
    }
    return "?";
}

// A kind's name; anything else throws ConfigError naming the value (`what`
// starts the message: a program passes its flag).
inline AttentionKind parse_attention_kind(std::string_view s, std::string_view what = "attention") {
    for (AttentionKind k : {AttentionKind::automatic, AttentionKind::cudnn, AttentionKind::flash,
                            AttentionKind::materialized})
        if (s == attention_kind_name(k)) return k;
    throw ConfigError(std::string(what) + " " + std::string(s) + ": expected auto, cudnn, flash or materialized");
}

}  // namespace snug
