// PrecisionKind: a precision policy named at run time ("fp32", "bf16",
// "fp16"), and the one place that turns it into the policy type
// (visit_precision). Each name is the policy's own (policies.hpp's P::name);
// parsing, the command line's choices and the error's list all come from
// all_precision_kinds, so another policy is added here once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/precision/loss_scaler.hpp"
#include "snug/precision/policies.hpp"

namespace snug {

// fp16 trains with dynamic loss scaling. The loss scaler takes no memory of
// its own: TrainStep keeps its overflow flag under every policy.
enum class PrecisionKind : std::uint8_t { fp32, bf16, fp16 };

inline constexpr PrecisionKind all_precision_kinds[] = {PrecisionKind::fp32, PrecisionKind::bf16, PrecisionKind::fp16};

// Calls f.template operator()<Precision>() with the policy type of `p`:
// precision::Fp32, precision::Bf16 or precision::Fp16<DynamicLossScaler>.
template <class F>
constexpr decltype(auto) visit_precision(PrecisionKind p, F&& f) {
    switch (p) {
        case PrecisionKind::fp32: return f.template operator()<precision::Fp32>();
        case PrecisionKind::bf16: return f.template operator()<precision::Bf16>();
        case PrecisionKind::fp16: return f.template operator()<precision::Fp16<DynamicLossScaler>>();
    }
    throw ConfigError("precision kind " + std::to_string(static_cast<int>(p)) + " is not one snug compiles");
}

// "fp32", "bf16" or "fp16": the policy's name.
// (The lambda's [&] keeps it without a conversion to a function pointer,
// which nvcc warns of for a template lambda with no parameters.)
constexpr std::string_view precision_name(PrecisionKind p) {
    return visit_precision(p, [&]<class P>() { return std::string_view(P::name); });
}

// Every name, in order ("fp32, bf16, fp16"): what a command line accepts.
inline std::vector<std::string> precision_names() {
    std::vector<std::string> names;
    for (PrecisionKind p : all_precision_kinds) names.emplace_back(precision_name(p));
    return names;
}

// "fp32", "bf16" or "fp16"; anything else throws ConfigError naming it.
inline PrecisionKind parse_precision_kind(std::string_view s) {
    for (PrecisionKind p : all_precision_kinds)
        if (s == precision_name(p)) return p;
    throw ConfigError("precision '" + std::string(s) + "': expected fp32, bf16 or fp16");
}

// The PrecisionKind of a PrecisionPolicy type (by its name; a policy no
// kind names does not compile where this is a constant expression).
template <PrecisionPolicy P>
constexpr PrecisionKind precision_kind() {
    for (PrecisionKind p : all_precision_kinds)
        if (precision_name(p) == std::string_view(P::name)) return p;
    throw ConfigError("precision policy '" + std::string(P::name) + "' has no PrecisionKind");
}

}  // namespace snug
