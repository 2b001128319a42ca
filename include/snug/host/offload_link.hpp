// Optimizer offload on the host backend (optim/offload.hpp): the device's
// memory is host memory already, so an offloaded optimizer keeps its state in
// host memory charged to the host's ledger, not the device's, and updates the
// weights in place: nothing to move, no staging, no second stream.
#pragma once

#include "snug/core/device.hpp"

namespace snug::host {

struct OffloadLink {
    using host_device = Device;    // where the offloaded state lives and the update runs
    using pinned_device = Device;  // staging (none is allocated: shares_memory)
    static constexpr bool shares_memory = true;
    static constexpr int slots = 0;  // no gradient chunk is staged
};

}  // namespace snug::host
