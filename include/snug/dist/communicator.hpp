// Communicator<D>: collectives over the ranks of a job (dist/ranks.hpp) on
// device D's memory — what TrainStep calls to average gradients and losses
// across data-parallel ranks.
//
// On the host backend the device's memory is host memory: the ranks reduce
// it in place. On any other device (snug::Cuda, emulated or not) the values
// pass through a host staging buffer of at most `bucket` values at a time
// (download, reduce, upload), so any device trains data-parallel over MPI.
// A GPU job reduces on the device instead: dist/nccl.hpp's NcclCommunicator
// overrides the sums with NCCL's, on the tag's stream — and the gradient
// sums on a second stream, overlapped with the backward (start_sums).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/dist/ranks.hpp"
#include "snug/ops/kernels.hpp"
#include "snug/optim/parameter_group.hpp"

namespace snug::dist {

template <DeviceTag D>
class Communicator {
public:
    // `bucket`: values per staging round trip (host memory: 4 Mi floats = 16 MiB).
    explicit Communicator(Ranks& ranks, std::int64_t bucket = std::int64_t{1} << 22) : ranks_(ranks), bucket_(bucket) {
        if (bucket < 1) throw ConfigError("Communicator: bucket of " + std::to_string(bucket) + " values must be >= 1");
    }
    virtual ~Communicator() = default;
    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;

    int rank() const { return ranks_.rank(); }
    int size() const { return ranks_.size(); }
    Ranks& ranks() { return ranks_; }

    // data (n, device memory): the element-wise sum over the ranks, in place,
    // the same bits on every rank.
    virtual void all_reduce_sum(const D& dev, float* data, std::int64_t n, const char* what) {
        reduce(dev, data, n, what);
    }
    virtual void all_reduce_sum(const D& dev, double* data, std::int64_t n, const char* what) {
        reduce(dev, data, n, what);
    }

    // ZeRO-1 (see Ranks): rank r's part [cuts[r], cuts[r + 1]) of `data`
    // (device memory, fp32) becomes the sum over the ranks of that part.
    virtual void reduce_scatter_sum(const D& dev, float* data, std::span<const std::int64_t> cuts, const char* what) {
        if (ranks_.size() == 1) return;
        if constexpr (std::is_same_v<D, Host>) {
            ranks_.reduce_scatter_sum(data, cuts, what);
        } else {
            // Window by window of the staging bucket: each rank's part of the
            // window is reduced to it, and uploaded where it belongs.
            std::vector<float>& staging = staging_for<float>();
            for_each_window(cuts, bucket_, [&](std::int64_t at, std::int64_t m, std::span<const std::int64_t> window) {
                staging.resize(static_cast<std::size_t>(m));
                download(dev, staging.data(), data + at, m);
                ranks_.reduce_scatter_sum(staging.data(), window, what);
                const std::int64_t a = window[rank()], b = window[rank() + 1];
                upload(dev, data + at + a, staging.data() + a, b - a);
            });
        }
    }
    // Every rank's `data` (device memory) receives every rank's part.
    template <class T>
    void all_gather(const D& dev, T* data, std::span<const std::int64_t> cuts, const char* what) {
        std::vector<std::int64_t> bytes(cuts.begin(), cuts.end());
        for (std::int64_t& b : bytes) b *= static_cast<std::int64_t>(sizeof(T));
        all_gather_bytes(dev, data, bytes, what);
    }
    virtual void all_gather_bytes(const D& dev, void* data, std::span<const std::int64_t> byte_cuts, const char* what) {
        if (ranks_.size() == 1) return;
        if constexpr (std::is_same_v<D, Host>) {
            ranks_.all_gather(data, byte_cuts, what);
        } else {
            // Window by window (a bucket's bytes): this rank's part of the
            // window goes out, the whole window comes back.
            auto* device = static_cast<unsigned char*>(data);
            for_each_window(byte_cuts, bucket_ * std::int64_t{sizeof(float)},
                            [&](std::int64_t at, std::int64_t m, std::span<const std::int64_t> window) {
                                gather_staging_.resize(static_cast<std::size_t>(m));
                                const std::int64_t a = window[rank()], b = window[rank() + 1];
                                download(dev, gather_staging_.data() + a, device + at + a, b - a);
                                ranks_.all_gather(gather_staging_.data(), window, what);
                                upload(dev, device + at, gather_staging_.data(), m);
                            });
        }
    }

    // Gradient sums that may run while the backward goes on. start_sums:
    // each range of `data` (fp32 gradients) summed over the ranks once the
    // work queued so far on dev's stream is done — all of the range, or with
    // `cuts` (ZeRO-1; of the whole of `data`) only this rank's part of it.
    // finish_sums: every sum started is done before the work queued after it.
    // Here start_sums runs the blocking collectives above and returns when
    // they are done; NcclCommunicator queues them on a second stream and says
    // overlaps_backward(), and TrainStep then starts each block's ranges as
    // soon as the last micro-batch's backward is past that block.
    virtual bool overlaps_backward() const { return false; }
    virtual void start_sums(const D& dev, float* data, std::span<const ParameterRange> ranges,
                            std::span<const std::int64_t> cuts, const char* what) {
        for (const ParameterRange& r : ranges) {
            if (cuts.empty())
                all_reduce_sum(dev, data + r.offset, r.count, what);
            else
                reduce_scatter_sum(dev, data + r.offset, clipped(cuts, r), what);
        }
    }
    virtual void finish_sums(const D&, const char*) {}

protected:
    // The cuts of a whole buffer as cuts of its range r: each rank's part of
    // r (maybe empty), counted from r's start.
    static std::vector<std::int64_t> clipped(std::span<const std::int64_t> cuts, ParameterRange r) {
        std::vector<std::int64_t> out(cuts.size());
        for (std::size_t i = 0; i < cuts.size(); ++i)
            out[i] = std::clamp(cuts[i], r.offset, r.offset + r.count) - r.offset;
        return out;
    }

private:
    template <class T>
    void reduce(const D& dev, T* data, std::int64_t n, const char* what) {
        if (ranks_.size() == 1 || n == 0) return;
        if constexpr (std::is_same_v<D, Host>) {
            ranks_.all_reduce_sum(data, n, what);
        } else {
            std::vector<T>& staging = staging_for<T>();
            staging.resize(static_cast<std::size_t>(std::min(n, bucket_)));
            for (std::int64_t at = 0; at < n; at += bucket_) {
                const std::int64_t m = std::min(bucket_, n - at);
                download(dev, staging.data(), data + at, m);
                ranks_.all_reduce_sum(staging.data(), m, what);
                upload(dev, data + at, staging.data(), m);
            }
        }
    }
    // Calls f(at, m, window) for each window [at, at + m) of at most `size`
    // elements of [0, cuts.back()), window being the cuts clipped to it and
    // shifted to start at 0 (a rank's part may be empty there). Every rank
    // walks the same windows, so their collectives pair up.
    template <class F>
    static void for_each_window(std::span<const std::int64_t> cuts, std::int64_t size, F&& f) {
        for (std::int64_t at = 0; at < cuts.back(); at += size) {
            const std::int64_t m = std::min(size, cuts.back() - at);
            const std::vector<std::int64_t> window = clipped(cuts, {at, m});
            f(at, m, std::span<const std::int64_t>(window));
        }
    }
    template <class T>
    std::vector<T>& staging_for() {
        if constexpr (std::is_same_v<T, float>)
            return staging_f32_;
        else
            return staging_f64_;
    }

    Ranks& ranks_;
    std::int64_t bucket_;
    std::vector<float> staging_f32_;
    std::vector<double> staging_f64_;
    std::vector<unsigned char> gather_staging_;
};

}  // namespace snug::dist
