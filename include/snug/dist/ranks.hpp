// Ranks: the processes of one training job and the few collectives data
// parallelism needs of them, on host memory. Two models here and in
// dist/mpi.hpp:
//
//   SingleProcess   one rank; every collective returns its input (no MPI needed)
//   MpiRanks        the ranks mpirun started (dist/mpi.hpp, Debian's Open MPI)
//
// Why a run-time interface and not a template parameter of TrainStep: how
// many processes a job has is decided by the launcher (mpirun -np N), not by
// the program's source, and the collectives cost one call per update, not per
// element. The device-memory side (staging, later NCCL) is
// dist/communicator.hpp.
//
// Every collective must be called by every rank in the same order. One that
// some rank does not finish within timeout() throws RankTimeout on the ranks
// waiting in it, naming the ranks that no longer answer (MpiRanks).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <thread>

#include "snug/core/error.hpp"

namespace snug::dist {

// A collective waited longer than the job's timeout for another rank (one
// that died or hangs). The message names this rank, the collective and the
// ranks that do not answer.
class RankTimeout : public Error {
public:
    using Error::Error;
};

class Ranks {
public:
    virtual ~Ranks() = default;

    virtual int rank() const = 0;
    virtual int size() const = 0;
    // This rank's place among the ranks on its machine (0, 1, ...): which of
    // the machine's GPUs it trains on.
    virtual int local_rank() const = 0;
    // "MPI (Open MPI 4.1.4)", "single process": for reports.
    virtual std::string description() const = 0;

    // In place: every rank ends with the element-wise sum over the ranks, the
    // same bits on every rank (a rank's weights stay identical to the others').
    // `what` names the collective in a timeout's message.
    virtual void all_reduce_sum(float* data, std::int64_t n, const char* what) = 0;
    virtual void all_reduce_sum(double* data, std::int64_t n, const char* what) = 0;
    // Whether every rank passed the same value (a fingerprint of weights or options).
    virtual bool all_equal(std::uint64_t value, const char* what) = 0;
    // Whether any rank passed true (a stop request seen by one rank stops all).
    virtual bool any(bool value, const char* what) = 0;
    // `bytes` of `data` on rank `root` copied to every rank's `data`.
    virtual void broadcast(void* data, std::size_t bytes, int root, const char* what) = 0;

    // ZeRO-1's collectives, over a vector cut into one part per rank: rank r
    // owns [cuts[r], cuts[r + 1]) (size() + 1 cuts, 0 first, the length last).
    // reduce_scatter_sum: rank r's part of `data` becomes the sum over the
    // ranks of that part (in place; the rest of `data` is left undefined).
    virtual void reduce_scatter_sum(float* data, std::span<const std::int64_t> cuts, const char* what) = 0;
    // all_gather: every rank's `data` receives every rank's part (cuts in bytes).
    virtual void all_gather(void* data, std::span<const std::int64_t> byte_cuts, const char* what) = 0;
    // gather: rank `root`'s `whole` (byte_cuts.back() bytes) receives every
    // rank's `part` (its byte_cuts[r + 1] - byte_cuts[r] bytes) at its place;
    // `whole` is read on the root only.
    virtual void gather(const void* part, void* whole, std::span<const std::int64_t> byte_cuts, int root,
                        const char* what) = 0;
    // Waits until done() returns true, as a collective waits: answering the
    // other ranks meanwhile, and past timeout() throwing RankTimeout naming
    // this rank, `what` and the ranks that do not answer. For work the ranks
    // share outside these collectives: NCCL's on a GPU (dist/nccl.hpp).
    virtual void wait_until(const std::function<bool()>& done, const char* what) = 0;

    // Seconds a collective waits for the other ranks before RankTimeout.
    double timeout() const { return timeout_; }
    void set_timeout(double seconds) {
        if (!(seconds > 0.0))
            throw ConfigError("rank timeout " + std::to_string(seconds) + " s must be positive");
        timeout_ = seconds;
    }

    // Ends the whole job after an error on this rank (the others may be
    // waiting in a collective); a single process only returns.
    virtual void abort(int exit_code) = 0;

    double sum(double x, const char* what) {
        all_reduce_sum(&x, 1, what);
        return x;
    }

private:
    double timeout_ = 600.0;
};

// One process: every collective is the identity.
class SingleProcess final : public Ranks {
public:
    int rank() const override { return 0; }
    int size() const override { return 1; }
    int local_rank() const override { return 0; }
    std::string description() const override { return "single process"; }
    void all_reduce_sum(float*, std::int64_t, const char*) override {}
    void all_reduce_sum(double*, std::int64_t, const char*) override {}
    bool all_equal(std::uint64_t, const char*) override { return true; }
    bool any(bool value, const char*) override { return value; }
    void broadcast(void*, std::size_t, int, const char*) override {}
    void reduce_scatter_sum(float*, std::span<const std::int64_t>, const char*) override {}
    void all_gather(void*, std::span<const std::int64_t>, const char*) override {}
    void gather(const void* part, void* whole, std::span<const std::int64_t> byte_cuts, int, const char*) override {
        if (whole != part) std::memcpy(whole, part, static_cast<std::size_t>(byte_cuts.back()));
    }
    void wait_until(const std::function<bool()>& done, const char* what) override {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout());
        while (!done()) {
            if (std::chrono::steady_clock::now() > deadline)
                throw RankTimeout("the single process waited " + std::to_string(static_cast<int>(timeout())) +
                                  " s in the " + what);
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
    }
    void abort(int) override {}
};

// The process's single-process Ranks (what a run without a launcher uses).
inline SingleProcess& single_process() {
    static SingleProcess one;
    return one;
}

// Whether an MPI launcher (Open MPI's mpirun, or a PMI-based one) started
// this process: a program built without MPI refuses to run as one of N
// copies that would each train alone and write the same files.
inline bool launched_by_mpi() {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
        if (std::getenv(v) != nullptr) return true;
    return false;
}

// FNV-1a over bytes: a fingerprint ranks compare with all_equal.
inline std::uint64_t fingerprint(const void* data, std::size_t bytes, std::uint64_t h = 1469598103934665603ULL) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < bytes; ++i) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

}  // namespace snug::dist
