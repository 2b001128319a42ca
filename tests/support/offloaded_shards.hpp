// Test support: ZeRO-1 with the optimizer offloaded, on any device. For each
// rank's shard of the awkward groups, an Optimizer offloaded to the host and
// one on the device, started alike (from the host's fp32 weights, or from the
// device's working weights), make the same updates: the same working
// weights, the same state, bit for bit; the offloaded one's state sits in its
// host ledger, the shard's bytes and no more, and nothing in the device's.
// Run on the host backend (tests/host/offload_test.cpp, where the update
// works in place) and on snug::Cuda (tests/cuda/optim_test.cu: the chunks
// cross the offload link).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "snug/core/buffer.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/ops/kernels.hpp"
#include "snug/optim/optimizer.hpp"
#include "support/awkward_groups.hpp"

namespace snug::test {

// Every state buffer's bytes, downloaded from wherever it lives.
template <class Act, DeviceTag D>
std::vector<std::vector<unsigned char>> optimizer_state_bytes(Optimizer<Act, D>& opt, const D& dev) {
    std::vector<std::vector<unsigned char>> out;
    for (const StateBuffer& b : opt.state_buffers()) {
        std::vector<unsigned char> bytes(static_cast<std::size_t>(b.count) * dtype_size(b.dtype));
        const auto n = static_cast<std::int64_t>(bytes.size());
        if (b.on_host)
            std::copy_n(static_cast<const unsigned char*>(b.data), bytes.size(), bytes.begin());
        else
            download(dev, bytes.data(), static_cast<const unsigned char*>(b.data), n);
        out.push_back(std::move(bytes));
    }
    return out;
}

template <class Act, DeviceTag D>
void offloaded_shards_match(const D& dev, MomentStorage moments, MasterStorage master, int shards,
                            std::int64_t chunk) {
    const std::int64_t n = awkward_parameters;
    AdamWConfig cfg;
    cfg.moments = moments;
    cfg.master = master;
    AdamWConfig off_cfg = cfg;
    off_cfg.offload = true;
    off_cfg.offload_chunk = chunk;
    const std::vector<float> w0 = random_grad(static_cast<std::size_t>(n), 3);
    std::vector<Act> w0_act(w0.size());
    std::transform(w0.begin(), w0.end(), w0_act.begin(), [](float x) { return Act(x); });
    const std::vector<std::int64_t> cuts = AdamW<Act, D>::shard_cuts(n, awkward_groups, shards);
    for (int r = 0; r < shards; ++r) {
        for (const bool from_initial : {true, false}) {
            INFO("shard " << r << " of " << shards << ", moments " << moment_storage_name(moments) << ", master "
                          << master_storage_name(master) << ", chunks of " << chunk
                          << (from_initial ? ", from host weights" : ", from the device's working weights"));
            const std::int64_t a = cuts[static_cast<std::size_t>(r)], b = cuts[static_cast<std::size_t>(r) + 1];
            MemoryTracker data, on_device_ledger, offloaded_ledger;
            Buffer<Act, D> p1(data, MemoryCategory::parameters, static_cast<std::size_t>(n), "weights (device)");
            Buffer<Act, D> p2(data, MemoryCategory::parameters, static_cast<std::size_t>(n), "weights (offloaded)");
            Buffer<float, D> g(data, MemoryCategory::gradients, static_cast<std::size_t>(n), "gradients");
            upload(dev, p1.data(), w0_act.data(), n);
            upload(dev, p2.data(), w0_act.data(), n);
            const std::vector<float>* initial = from_initial ? &w0 : nullptr;
            Optimizer<Act, D> on_device(dev, on_device_ledger, n, awkward_groups, cfg, p1.data(), initial, {a, b});
            Optimizer<Act, D> offloaded(dev, offloaded_ledger, n, awkward_groups, off_cfg, p2.data(), initial, {a, b});
            REQUIRE(offloaded.offloaded());
            for (int s = 0; s < 3; ++s) {
                const std::vector<float> grads = random_grad(static_cast<std::size_t>(n), 10 + static_cast<std::uint32_t>(s));
                upload(dev, g.data(), grads.data(), n);
                on_device.step(dev, p1.data() + a, g.data() + a, 1e-2f, 0.5f);
                offloaded.step(dev, p2.data() + a, g.data() + a, 1e-2f, 0.5f);
            }
            dev.synchronize();
            std::vector<Act> w1(static_cast<std::size_t>(n)), w2(w1.size());
            download(dev, w1.data(), p1.data(), n);
            download(dev, w2.data(), p2.data(), n);
            CHECK(bytes_of(w1.data(), w1.size() * sizeof(Act)) == bytes_of(w2.data(), w2.size() * sizeof(Act)));
            // The shard moved; the rest of the weights did not.
            CHECK(bytes_of(w1.data(), static_cast<std::size_t>(a) * sizeof(Act)) ==
                  bytes_of(w0_act.data(), static_cast<std::size_t>(a) * sizeof(Act)));
            CHECK(optimizer_state_bytes(on_device, dev) == optimizer_state_bytes(offloaded, dev));
            // The state: the shard's, in the host's ledger only.
            const std::size_t state = on_device_ledger.current(MemoryCategory::optimizer_state) +
                                      on_device_ledger.current(MemoryCategory::master_weights);
            CHECK(state > 0);
            CHECK(offloaded_ledger.current_total() == 0);
            const MemoryTracker& host = offloaded.host_memory();
            CHECK(host.current(MemoryCategory::optimizer_state) + host.current(MemoryCategory::master_weights) == state);
            // The host copy of the working weights holds the shard only (none
            // where the device's memory is the host's).
            const std::size_t copy = D::offload_link::shares_memory ? 0 : static_cast<std::size_t>(b - a) * sizeof(Act);
            CHECK(host.current(MemoryCategory::parameters) == copy);
        }
    }
}

}  // namespace snug::test
