// CheckpointKind: a checkpoint policy named at run time ("none", "full",
// "every:K", "selective", "auto"), and the one place that turns it into the
// policy type (visit_checkpoint). Parsing and the command line's choices come
// from all_checkpoint_kinds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "snug/checkpoint/policies.hpp"
#include "snug/core/error.hpp"

namespace snug {

// The checkpoint policies a run can name. every:K is compiled for K = 2, 3, 4:
// each K is its own type (checkpoint::EveryNth<K>), and more would multiply
// the templates every program instantiates. `automatic` is checkpoint::Budget.
enum class CheckpointKind : std::uint8_t { none, full, every2, every3, every4, selective, automatic };

inline constexpr CheckpointKind all_checkpoint_kinds[] = {
    CheckpointKind::none,   CheckpointKind::full,      CheckpointKind::every2,   CheckpointKind::every3,
    CheckpointKind::every4, CheckpointKind::selective, CheckpointKind::automatic,
};

// The name a command line uses ("none", "full", "every:2", "selective", "auto", ...).
constexpr const char* checkpoint_kind_name(CheckpointKind k) {
    switch (k) {
        case CheckpointKind::none: return "none";
        case CheckpointKind::full: return "full";
        case CheckpointKind::every2: return "every:2";
        case CheckpointKind::every3: return "every:3";
        case CheckpointKind::every4: return "every:4";
        case CheckpointKind::selective: return "selective";
        case CheckpointKind::automatic: return "auto";
    }
    return "?";
}

// "none", "full", "selective", "auto" or "every:K" (K = 2, 3, 4); anything
// else throws ConfigError naming the value. `what` starts the message (a
// program passes its flag, "--checkpoint").
inline CheckpointKind parse_checkpoint_kind(std::string_view s, std::string_view what = "checkpoint") {
    for (CheckpointKind k : all_checkpoint_kinds)
        if (s == checkpoint_kind_name(k)) return k;
    const std::string head = std::string(what) + " " + std::string(s) + ": ";
    if (s.substr(0, 6) == "every:")
        throw ConfigError(head + "every:K is compiled for K = 2, 3, 4 only "
                                 "(every:1 is 'full'; use 'auto' to fit a budget)");
    throw ConfigError(head + "expected none, full, every:K (K = 2, 3, 4), selective or auto");
}

// Every name, in order: what a command line accepts.
inline std::vector<std::string> checkpoint_names() {
    std::vector<std::string> names;
    for (CheckpointKind k : all_checkpoint_kinds) names.emplace_back(checkpoint_kind_name(k));
    return names;
}

// Calls f.template operator()<Checkpoint>() with the policy type of `k`.
template <class F>
auto visit_checkpoint(CheckpointKind k, F&& f) {
    namespace ck = checkpoint;
    switch (k) {
        case CheckpointKind::none: return f.template operator()<ck::None>();
        case CheckpointKind::full: return f.template operator()<ck::Full>();
        case CheckpointKind::every2: return f.template operator()<ck::EveryNth<2>>();
        case CheckpointKind::every3: return f.template operator()<ck::EveryNth<3>>();
        case CheckpointKind::every4: return f.template operator()<ck::EveryNth<4>>();
        case CheckpointKind::selective: return f.template operator()<ck::Selective>();
        case CheckpointKind::automatic: return f.template operator()<ck::Budget>();
    }
    throw ConfigError("checkpoint kind " + std::to_string(static_cast<int>(k)) + " is not one snug compiles");
}

}  // namespace snug
