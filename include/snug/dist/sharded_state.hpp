// An optimizer's state sharded across ranks (ZeRO-1), gathered whole on one
// rank: what a training-state file holds, so a ZeRO-1 run saves the same file
// as an unsharded one (and any rank count can read its slices back:
// train/state_file.hpp loads only a shard's part of each section).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "snug/core/dtype.hpp"
#include "snug/dist/ranks.hpp"
#include "snug/ops/kernels.hpp"
#include "snug/optim/adamw.hpp"

namespace snug::dist {

// Every buffer of the state, whole, in host memory (on the root rank).
struct GatheredState {
    std::vector<std::vector<unsigned char>> bytes;
    std::vector<StateBuffer> buffers;  // whole (offset 0, count = total), on_host, pointing into bytes
};

// Collective: every rank calls it. Each rank's shard of each of
// opt.state_buffers() — or of the one named `only` — goes to `root`, which
// receives the buffers whole (host memory: the state's bytes); the other
// ranks get empty buffers.
template <class Opt, class D>
GatheredState gather_state(Opt& opt, const D& dev, Ranks& ranks, int root = 0, std::string_view only = {}) {
    GatheredState g;
    const int N = ranks.size();
    for (const StateBuffer& b : opt.state_buffers()) {
        if (!only.empty() && b.name != only) continue;
        const auto size = static_cast<std::int64_t>(dtype_size(b.dtype));
        // Where each rank's shard of this buffer starts (the shards tile it in rank order).
        std::vector<std::int64_t> starts(static_cast<std::size_t>(N)), byte_cuts(starts.size() + 1);
        starts[ranks.rank()] = b.offset;
        for (int r = 0; r <= N; ++r) byte_cuts[r] = r * std::int64_t{8};
        ranks.all_gather(starts.data(), byte_cuts, "gather of the optimizer state's shard offsets");
        for (int r = 0; r < N; ++r) byte_cuts[r] = starts[r] * size;
        byte_cuts[N] = b.whole() * size;
        const bool is_root = ranks.rank() == root;
        std::vector<unsigned char> whole(static_cast<std::size_t>(is_root ? byte_cuts[N] : 0));
        std::vector<unsigned char> mine(static_cast<std::size_t>(is_root ? 0 : b.count * size));
        // This rank's shard: at its place in the whole on the root.
        unsigned char* at = is_root ? whole.data() + b.offset * size : mine.data();
        if (b.on_host)
            download(Host{}, at, static_cast<const unsigned char*>(b.data), b.count * size);
        else
            download(dev, at, static_cast<const unsigned char*>(b.data), b.count * size);
        ranks.gather(at, whole.data(), byte_cuts, root, "gather of the optimizer state");
        g.bytes.push_back(std::move(whole));
        g.buffers.push_back({b.name, b.dtype, nullptr, is_root ? b.whole() : 0, true, 0, is_root ? b.whole() : 0});
    }
    // bytes may have moved while it grew: point again.
    for (std::size_t k = 0; k < g.buffers.size(); ++k) g.buffers[k].data = g.bytes[k].data();
    return g;
}

}  // namespace snug::dist
