// Recompute: how much of one layer's forward is kept for its backward — the
// unit of every checkpoint plan. It stands below the layers (nn/) that apply
// it and the policies (checkpoint/policies.hpp) that choose it.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace snug {

enum class Recompute : std::uint8_t {
    none,       // keep everything the layer saves
    selective,  // keep the expensive part (GEMM outputs), recompute the cheap rest
    full,       // keep nothing: the whole forward runs again in backward
};

inline const char* recompute_name(Recompute r) {
    switch (r) {
        case Recompute::none: return "none";
        case Recompute::selective: return "selective";
        case Recompute::full: return "full";
    }
    return "?";
}

// A plan, one mode per layer, as its names: "none selective full".
inline std::string describe_plan(std::span<const Recompute> plan) {
    std::string out;
    for (std::size_t i = 0; i < plan.size(); ++i) {
        if (i > 0) out += ' ';
        out += recompute_name(plan[i]);
    }
    return out;
}

}  // namespace snug
