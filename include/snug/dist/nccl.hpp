// NcclCommunicator: data parallel across GPUs — the gradient and loss sums
// of TrainStep done by NCCL (from the CUDA toolkit) on the device, queued on
// the training stream, instead of staged through the host over MPI.
//
//   auto ranks = snug::dist::join_ranks(&argc, &argv);   // dist/mpi.hpp
//   snug::dist::use_local_gpu(*ranks);                   // before any CUDA work
//   ... Session<Cuda> s; ...
//   snug::dist::NcclCommunicator nccl(*ranks, s.ctx.device);
//   step.data_parallel(nccl);
//
// The ranks bootstrap NCCL: rank 0 makes its unique id and broadcasts it over
// `ranks` (MPI), then every rank joins on its current GPU. One GPU per rank.
// Sums are ncclAllReduce in place: NCCL's ring gives every rank the same bits
// (its reduction order does not depend on the rank).
//
// A peer that dies or hangs would leave NCCL's kernels spinning on this GPU
// and the host waiting in CUDA forever; so after queuing a collective the
// rank waits for it as for an MPI collective (Ranks::wait_until: answering
// the other ranks, --rank-timeout at most, then RankTimeout naming the ranks
// that do not answer), watching NCCL's asynchronous error too, and aborts
// the communicator (ncclCommAbort frees the stuck kernels) before it throws.
// The wait costs one host round trip per collective: TrainStep reads the
// overflow flag and the loss right after the sums anyway.
//
// The gradient sums overlap the backward (overlaps_backward): start_sums
// queues a block's ranges, one NCCL group, on a second stream that first
// waits for the training stream's work so far; the backward goes on, and the
// sums of the next blocks queue behind. finish_sums makes the training
// stream wait for the second one and waits, as above, until both are done.
//
// Needs a real GPU: the emulated backend has no NCCL (its device pointers are
// host memory); a program built for it uses the staged dist::Communicator.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/runtime.hpp"
#include "snug/dist/communicator.hpp"
#include "snug/dist/ranks.hpp"

namespace snug::dist {

// Makes this rank's GPU current: GPU local_rank mod (the machine's GPUs), so
// the ranks on one machine train on different cards. Call before any CUDA work.
inline void use_local_gpu(const Ranks& ranks) {
    int count = 0;
    cuda::check(cudaGetDeviceCount(&count));
    if (count < 1) throw NoCudaDevice("use_local_gpu: no CUDA device on this machine");
    cuda::check(cudaSetDevice(ranks.local_rank() % count));
}

class NcclCommunicator final : public Communicator<Cuda> {
public:
    // Every rank calls this together, with the GPU it trains on current.
    NcclCommunicator(Ranks& ranks, const Cuda& dev) : Communicator<Cuda>(ranks), stream_(dev.stream) {
        ncclUniqueId id{};
        if (ranks.rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
        ranks.broadcast(&id, sizeof id, 0, "broadcast of NCCL's unique id");
        check(ncclCommInitRank(&comm_, ranks.size(), id, ranks.rank()), "ncclCommInitRank");
        cuda::check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
        cuda::check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
        cuda::check(cudaEventCreateWithFlags(&side_done_, cudaEventDisableTiming));
        cuda::check(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    }
    // ncclCommDestroy waits for the queued collectives, which never end when
    // a peer is gone: while an exception unwinds, the communicator is aborted.
    ~NcclCommunicator() override {
        if (comm_ != nullptr && std::uncaught_exceptions() > 0)
            ncclCommAbort(comm_);
        else if (comm_ != nullptr)
            ncclCommDestroy(comm_);
        if (done_ != nullptr) cudaEventDestroy(done_);
        if (ready_ != nullptr) cudaEventDestroy(ready_);
        if (side_done_ != nullptr) cudaEventDestroy(side_done_);
        if (side_ != nullptr) cudaStreamDestroy(side_);
    }

    void all_reduce_sum(const Cuda& dev, float* data, std::int64_t n, const char* what) override {
        sum(dev, data, n, ncclFloat32, what);
    }
    void all_reduce_sum(const Cuda& dev, double* data, std::int64_t n, const char* what) override {
        sum(dev, data, n, ncclFloat64, what);
    }

    // Uneven parts: one ncclReduce per rank (to that rank) in a group.
    void reduce_scatter_sum(const Cuda& dev, float* data, std::span<const std::int64_t> cuts,
                            const char* what) override {
        if (size() == 1) return;
        check_stream(dev, what);
        check(ncclGroupStart(), what);
        for (int r = 0; r < size(); ++r)
            check(ncclReduce(data + cuts[r], data + cuts[r], static_cast<std::size_t>(cuts[r + 1] - cuts[r]),
                             ncclFloat32, ncclSum, r, comm_, dev.stream),
                  what);
        check(ncclGroupEnd(), what);
        wait(what);
    }
    // One ncclBroadcast per rank (from that rank) in a group.
    void all_gather_bytes(const Cuda& dev, void* data, std::span<const std::int64_t> byte_cuts,
                          const char* what) override {
        if (size() == 1) return;
        check_stream(dev, what);
        auto* bytes = static_cast<unsigned char*>(data);
        check(ncclGroupStart(), what);
        for (int r = 0; r < size(); ++r)
            check(ncclBroadcast(bytes + byte_cuts[r], bytes + byte_cuts[r],
                                static_cast<std::size_t>(byte_cuts[r + 1] - byte_cuts[r]), ncclUint8, r, comm_,
                                dev.stream),
                  what);
        check(ncclGroupEnd(), what);
        wait(what);
    }

    bool overlaps_backward() const override { return true; }
    // One group on the second stream, after the training stream's work so
    // far: ncclAllReduce per range, or under ZeRO-1 one ncclReduce per
    // rank's non-empty part of each range.
    void start_sums(const Cuda& dev, float* data, std::span<const ParameterRange> ranges,
                    std::span<const std::int64_t> cuts, const char* what) override {
        if (size() == 1 || ranges.empty()) return;
        check_stream(dev, what);
        cuda::check(cudaEventRecord(ready_, stream_));
        cuda::check(cudaStreamWaitEvent(side_, ready_, 0));
        check(ncclGroupStart(), what);
        for (const ParameterRange& r : ranges) {
            float* at = data + r.offset;
            if (cuts.empty()) {
                check(ncclAllReduce(at, at, static_cast<std::size_t>(r.count), ncclFloat32, ncclSum, comm_, side_),
                      what);
                continue;
            }
            const std::vector<std::int64_t> part = clipped(cuts, r);
            for (int q = 0; q < size(); ++q) {
                const std::int64_t n = part[q + 1] - part[q];
                if (n > 0)
                    check(ncclReduce(at + part[q], at + part[q], static_cast<std::size_t>(n), ncclFloat32, ncclSum, q,
                                     comm_, side_),
                          what);
            }
        }
        check(ncclGroupEnd(), what);
        started_ = true;
    }
    void finish_sums(const Cuda& dev, const char* what) override {
        if (!started_) return;
        check_stream(dev, what);
        cuda::check(cudaEventRecord(side_done_, side_));
        cuda::check(cudaStreamWaitEvent(stream_, side_done_, 0));
        started_ = false;
        wait(what);
    }

private:
    void check_stream(const Cuda& dev, const char* what) const {
        if (dev.stream != stream_)
            throw Error(std::string("NcclCommunicator: the ") + what +
                        " was asked on another stream than the one the communicator was made for");
    }
    void sum(const Cuda& dev, void* data, std::int64_t n, ncclDataType_t type, const char* what) {
        if (size() == 1 || n == 0) return;
        check_stream(dev, what);
        check(ncclAllReduce(data, data, static_cast<std::size_t>(n), type, ncclSum, comm_, dev.stream), what);
        wait(what);
    }
    // Until the stream reaches the end of the collective just queued (the
    // work before it included), watched as the class comment says.
    void wait(const char* what) {
        cuda::check(cudaEventRecord(done_, stream_));
        const std::string name = std::string("NCCL ") + what;
        try {
            ranks().wait_until(
                [&] {
                    ncclResult_t async = ncclSuccess;
                    check(ncclCommGetAsyncError(comm_, &async), what);
                    check(async, what);
                    const cudaError_t state = cudaEventQuery(done_);
                    if (state == cudaErrorNotReady) return false;
                    cuda::check(state);
                    return true;
                },
                name.c_str());
        } catch (...) {
            ncclCommAbort(comm_);
            comm_ = nullptr;
            throw;
        }
    }
    void check(ncclResult_t result, const char* what) const {
        if (result == ncclSuccess) return;
        throw Error("rank " + std::to_string(rank()) + ": NCCL failed in the " + what + ": " +
                    ncclGetErrorString(result));
    }

    ncclComm_t comm_ = nullptr;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t done_ = nullptr;  // recorded after each collective
    cudaStream_t side_ = nullptr;  // the gradient sums that overlap the backward
    cudaEvent_t ready_ = nullptr;      // the training stream's work before a start_sums
    cudaEvent_t side_done_ = nullptr;  // the second stream's sums, at finish_sums
    bool started_ = false;             // sums queued there since the last finish_sums
};

}  // namespace snug::dist
