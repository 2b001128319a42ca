// DeviceInfo: which backend a run uses and a line saying why, as
// choose_device (session.hpp) decides it. Plain data, for what only shows it.
#pragma once

#include <string>

namespace snug {

// Which backend a run uses, and a line saying why.
struct DeviceInfo {
    bool cuda = false;
    std::string name = "host";   // what the peak-FLOP/s table (metrics.hpp) is asked about
    std::string description;
};

}  // namespace snug
