// upload_weights: what every model's load_weights does — check that the fp32
// host values (an initialisation, a file's weights) are one per parameter,
// round each once to the working type, copy them to the device.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "snug/core/error.hpp"

namespace snug {

// dst (count elements of Act on dev's device) = Act(host[i]). Throws
// ShapeError naming `who` when host does not hold exactly count values.
// `upload` is the device's own (found by argument-dependent lookup).
template <class Act, class Dev>
void upload_weights(const Dev& dev, Act* dst, std::int64_t count, std::span<const float> host, std::string_view who) {
    if (static_cast<std::int64_t>(host.size()) != count)
        throw ShapeError(std::string(who) + " weights: expected " + std::to_string(count) + " values, got " +
                         std::to_string(host.size()));
    if constexpr (std::is_same_v<Act, float>) {
        upload(dev, dst, host.data(), count);
    } else {
        const std::vector<Act> rounded(host.begin(), host.end());
        upload(dev, dst, rounded.data(), count);
    }
}

}  // namespace snug
