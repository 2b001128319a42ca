// The size check every op starts with, the same on every backend: sizes are
// non-negative, and an error names the op and every size it was given.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "snug/core/error.hpp"

namespace snug::ops {

using NamedSizes = std::initializer_list<std::pair<const char*, std::int64_t>>;

// Throws ShapeError "<op>: negative size (name = value, ...)" when any of the
// named sizes is negative.
inline void check_non_negative(const char* op, NamedSizes sizes) {
    bool bad = false;
    for (const auto& s : sizes) bad = bad || s.second < 0;
    if (!bad) return;
    std::string msg = std::string(op) + ": negative size (";
    bool first = true;
    for (const auto& [name, value] : sizes) {
        msg += (first ? "" : ", ") + std::string(name) + " = " + std::to_string(value);
        first = false;
    }
    throw ShapeError(msg + ")");
}

}  // namespace snug::ops
