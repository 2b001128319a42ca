// The optimizer-memory policy as plain data: the types AdamW (optim/adamw.hpp)
// keeps its state in, their names and parsers. Apart from AdamW so that what
// only describes a run (the planner's input, a RunSpec) needs no kernel.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "snug/core/error.hpp"

namespace snug {

// The optimizer-memory policy: the types AdamW keeps its state in. fp32
// everything is PyTorch's AdamW (16 bytes a parameter with 16-bit weights:
// weights 2, fp32 gradients 4, master 4, moments 8). Lean choices, each
// rounding stochastically (core/stochastic_rounding.hpp) from a Philox stream
// of (rounding_seed, step, parameter index), so a run is reproducible and a
// resumed run continues bit for bit:
//   moments bf16: m and v in bfloat16 (moments 8 -> 4 bytes a parameter);
//   moments int8: m and v as 8-bit codes in blocks of 256 with an fp32
//                 absmax per block (8 -> 2.03 bytes a parameter) for the
//                 groups with weight decay, fp32 for the others (biases,
//                 norms); ops/moment_quantization.hpp;
//   master none:  bf16 weights updated in place, no fp32 copy (4 -> 0 bytes);
//                 bf16 weights only (fp32 weights are their own master; fp16's
//                 stochastic rounding is not built).
// The update itself is computed in fp32 either way.
enum class MomentStorage : std::uint8_t { fp32, bf16, int8 };
enum class MasterStorage : std::uint8_t { fp32, none };

constexpr std::string_view moment_storage_name(MomentStorage s) {
    switch (s) {
        case MomentStorage::fp32: return "fp32";
        case MomentStorage::bf16: return "bf16";
        case MomentStorage::int8: return "int8";
    }
    return "?";
}
constexpr std::string_view master_storage_name(MasterStorage s) { return s == MasterStorage::fp32 ? "fp32" : "none"; }

// "fp32", "bf16" or "int8"; anything else throws ConfigError naming it.
inline MomentStorage parse_moment_storage(std::string_view s) {
    for (MomentStorage m : {MomentStorage::fp32, MomentStorage::bf16, MomentStorage::int8})
        if (s == moment_storage_name(m)) return m;
    throw ConfigError("optimizer state '" + std::string(s) + "': expected fp32, bf16 or int8");
}

// "fp32" or "none"; anything else throws ConfigError naming it.
inline MasterStorage parse_master_storage(std::string_view s) {
    for (MasterStorage m : {MasterStorage::fp32, MasterStorage::none})
        if (s == master_storage_name(m)) return m;
    throw ConfigError("master weights '" + std::string(s) + "': expected fp32 or none");
}

}  // namespace snug
