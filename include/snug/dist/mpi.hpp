// MpiRanks: the ranks `mpirun -np N` started, as dist::Ranks (Debian's Open
// MPI, libopenmpi-dev). join_ranks() is what a program calls first thing in
// main: MpiRanks when an MPI launcher started it, else the single process.
//
// Collectives are non-blocking MPI calls polled against the job's timeout:
// a rank that died or hangs cannot leave the others waiting forever. A rank
// that times out pings the others (every rank waiting in a collective
// answers) and names those that stay silent. Sums are a reduce-scatter then an all-gather: each part of the
// vector is added up on exactly one rank, so every rank receives the same
// bits, and weights stay identical across ranks update after update.
//
// Include this header from a file the host compiler builds (as the examples'
// ranks.cpp): the engine itself (train/run.hpp) only sees dist::Ranks.
#pragma once

// Only MPI's C interface: Open MPI's deprecated C++ bindings do not compile
// warning-free.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <span>
#include <thread>
#include <type_traits>
#include <vector>

#include "snug/dist/ranks.hpp"

namespace snug::dist {

class MpiRanks final : public Ranks {
public:
    // Starts MPI (the main thread alone calls it) unless the program already
    // has, and ends it in the destructor if it started it.
    MpiRanks(int* argc, char*** argv) {
        int initialized = 0;
        MPI_Initialized(&initialized);
        if (!initialized) {
            int provided = 0;
            check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
            owns_mpi_ = true;
        }
        check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
        // Errors come back as codes (and become snug::Error), not aborts.
        MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &size_);
        MPI_Comm node = MPI_COMM_NULL;  // the ranks that share this machine's memory
        check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
        MPI_Comm_rank(node, &local_rank_);
        MPI_Comm_free(&node);
    }
    MpiRanks(const MpiRanks&) = delete;
    MpiRanks& operator=(const MpiRanks&) = delete;
    ~MpiRanks() override {
        if (aborted_) return;
        MPI_Comm_free(&comm_);
        if (owns_mpi_) MPI_Finalize();
    }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    int local_rank() const override { return local_rank_; }
    std::string description() const override {
        char version[MPI_MAX_LIBRARY_VERSION_STRING];
        int length = 0;
        MPI_Get_library_version(version, &length);
        std::string v(version, static_cast<std::size_t>(length));
        v = v.substr(0, v.find_first_of(",\n"));
        return "MPI (" + v + ")";
    }

    void all_reduce_sum(float* data, std::int64_t n, const char* what) override { sum_in_place(data, n, what); }
    void all_reduce_sum(double* data, std::int64_t n, const char* what) override { sum_in_place(data, n, what); }
    void reduce_scatter_sum(float* data, std::span<const std::int64_t> cuts, const char* what) override {
        check_cuts(cuts, what);
        scatter_sums(data, cuts, what);
    }
    void all_gather(void* data, std::span<const std::int64_t> byte_cuts, const char* what) override {
        check_cuts(byte_cuts, what);
        auto* bytes = static_cast<unsigned char*>(data);
        gather_parts(bytes + byte_cuts[rank_], bytes, byte_cuts, -1, what);
    }
    void gather(const void* part, void* whole, std::span<const std::int64_t> byte_cuts, int root,
                const char* what) override {
        check_cuts(byte_cuts, what);
        const auto* mine = static_cast<const unsigned char*>(part);
        auto* all = static_cast<unsigned char*>(whole);
        if (rank_ == root && all + byte_cuts[rank_] != mine)
            std::memmove(all + byte_cuts[rank_], mine, static_cast<std::size_t>(byte_cuts[rank_ + 1] - byte_cuts[rank_]));
        gather_parts(mine, all, byte_cuts, root, what);
    }
    bool all_equal(std::uint64_t value, const char* what) override {
        std::uint64_t low[2] = {value, ~value}, high[2] = {0, 0};  // min of value and of ~value: min and max
        ++seq_;
        MPI_Request r = MPI_REQUEST_NULL;
        check(MPI_Iallreduce(low, high, 2, MPI_UINT64_T, MPI_MIN, comm_, &r), what);
        wait(&r, 1, what);
        return high[0] == value && ~high[1] == value;
    }
    bool any(bool value, const char* what) override {
        int in = value ? 1 : 0, out = 0;
        ++seq_;
        MPI_Request r = MPI_REQUEST_NULL;
        check(MPI_Iallreduce(&in, &out, 1, MPI_INT, MPI_MAX, comm_, &r), what);
        wait(&r, 1, what);
        return out != 0;
    }
    void broadcast(void* data, std::size_t bytes, int root, const char* what) override {
        if (bytes > static_cast<std::size_t>(INT_MAX))
            throw Error(std::string("MpiRanks: the ") + what + " broadcasts " + std::to_string(bytes) +
                        " bytes, more than one MPI call carries");
        ++seq_;
        MPI_Request r = MPI_REQUEST_NULL;
        check(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_, &r), what);
        wait(&r, 1, what);
    }
    void wait_until(const std::function<bool()>& done, const char* what) override {
        poll_until(done, what, Waiting::other_work);
    }
    void abort(int exit_code) override {
        aborted_ = true;
        MPI_Abort(MPI_COMM_WORLD, exit_code);
    }

private:
    // An all-reduce: a reduce-scatter over equal parts, then an all-gather.
    template <class T>
    void sum_in_place(T* data, std::int64_t n, const char* what) {
        std::vector<std::int64_t> cuts(static_cast<std::size_t>(size_) + 1), bytes(cuts.size());
        for (int r = 0; r <= size_; ++r) {
            cuts[r] = n / size_ * r + std::min<std::int64_t>(r, n % size_);
            bytes[r] = cuts[r] * static_cast<std::int64_t>(sizeof(T));
        }
        scatter_sums(data, std::span<const std::int64_t>(cuts), what);
        auto* all = reinterpret_cast<unsigned char*>(data);
        gather_parts(all + bytes[rank_], all, bytes, -1, what);
    }

    void check_cuts(std::span<const std::int64_t> cuts, const char* what) const {
        bool ok = cuts.size() == static_cast<std::size_t>(size_) + 1 && cuts.front() == 0;
        for (std::size_t i = 1; ok && i < cuts.size(); ++i) ok = cuts[i] >= cuts[i - 1];
        if (!ok)
            throw Error(std::string("MpiRanks: the ") + what + " needs " + std::to_string(size_ + 1) +
                        " non-decreasing cuts from 0, one part per rank; got " + std::to_string(cuts.size()));
    }

    // MPI counts are ints: the vector goes in windows of at most 2^30
    // elements, each rank's part of a window as its count. The reduce-scatter
    // leaves rank r's sum at the start of the window; it moves to its place.
    template <class T>
    void scatter_sums(T* data, std::span<const std::int64_t> cuts, const char* what) {
        const MPI_Datatype type = std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
        for (std::int64_t at = 0; at < cuts.back(); at += window) {
            const std::int64_t end = std::min(cuts.back(), at + window);
            std::vector<int> counts(static_cast<std::size_t>(size_));
            for (int r = 0; r < size_; ++r)
                counts[r] = static_cast<int>(std::max<std::int64_t>(
                    0, std::min(end, cuts[r + 1]) - std::max(at, cuts[r])));
            ++seq_;
            MPI_Request req = MPI_REQUEST_NULL;
            check(MPI_Ireduce_scatter(MPI_IN_PLACE, data + at, counts.data(), type, MPI_SUM, comm_, &req), what);
            wait(&req, 1, what);
            const std::int64_t mine = std::max(at, cuts[rank_]);
            if (counts[rank_] > 0 && mine != at)
                std::memmove(data + mine, data + at, sizeof(T) * static_cast<std::size_t>(counts[rank_]));
        }
    }
    // Every rank's part (byte cuts; this rank's at `mine`) into `data` of
    // every rank (root -1, where `mine` is its place in `data`) or of root
    // alone (where it is in place already).
    void gather_parts(const unsigned char* mine, unsigned char* data, std::span<const std::int64_t> cuts, int root,
                      const char* what) {
        for (std::int64_t at = 0; at < cuts.back(); at += window) {
            const std::int64_t end = std::min(cuts.back(), at + window);
            std::vector<int> counts(static_cast<std::size_t>(size_)), displs(counts.size());
            for (int r = 0; r < size_; ++r) {
                const std::int64_t a = std::clamp(cuts[r], at, end), b = std::clamp(cuts[r + 1], at, end);
                counts[r] = static_cast<int>(b - a);
                displs[r] = static_cast<int>(a - at);
            }
            ++seq_;
            MPI_Request req = MPI_REQUEST_NULL;
            unsigned char* w = data + at;
            if (root < 0)
                check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, w, counts.data(), displs.data(), MPI_BYTE, comm_, &req),
                      what);
            else if (rank_ == root)
                check(MPI_Igatherv(MPI_IN_PLACE, 0, MPI_BYTE, w, counts.data(), displs.data(), MPI_BYTE, root, comm_,
                                   &req),
                      what);
            else
                check(MPI_Igatherv(mine + (std::max(at, cuts[rank_]) - cuts[rank_]), counts[rank_], MPI_BYTE, nullptr,
                                   nullptr, nullptr, MPI_BYTE, root, comm_, &req),
                      what);
            wait(&req, 1, what);
        }
    }

    static constexpr std::int64_t window = std::int64_t{1} << 30;

    // What a rank waits for: one of these collectives (numbered), or work the
    // ranks share outside them (wait_until: NCCL's), after the last one.
    enum class Waiting : bool { collective, other_work };

    // Polls the requests until all are complete (see poll_until).
    void wait(MPI_Request* requests, int count, const char* what) {
        poll_until(
            [&] {
                int done = 0;
                check(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE), what);
                return done != 0;
            },
            what, Waiting::collective);
    }

    // Calls done() until it returns true, answering other ranks' pings
    // meanwhile; past the timeout, pings every other rank and throws
    // RankTimeout naming those that do not answer. Spins a little first
    // (ranks usually arrive together), then sleeps between polls, at most
    // 500 µs, so a waiting rank leaves its core to the node's other ranks.
    template <class Done>
    void poll_until(Done&& done, const char* what, Waiting waiting) {
        using clock = std::chrono::steady_clock;
        const auto deadline = clock::now() + std::chrono::duration<double>(timeout());
        auto pause = std::chrono::microseconds(10);
        for (int polls = 0;; ++polls) {
            if (done()) return;
            answer_pings();
            if (polls < 200) continue;
            if (clock::now() > deadline) throw RankTimeout(timeout_message(what, waiting));
            std::this_thread::sleep_for(pause);
            pause = std::min(pause * 2, std::chrono::microseconds(500));
        }
    }

    // A rank that timed out asks the others whether they are alive: every
    // rank waiting in a collective answers (a dead or frozen one cannot).
    void answer_pings() {
        for (;;) {
            int flag = 0;
            MPI_Status status;
            MPI_Iprobe(MPI_ANY_SOURCE, ping_tag, comm_, &flag, &status);
            if (!flag) return;
            std::int64_t seq = 0;
            MPI_Recv(&seq, 1, MPI_INT64_T, status.MPI_SOURCE, ping_tag, comm_, MPI_STATUS_IGNORE);
            pongs_.push_back(seq);
            MPI_Request r = MPI_REQUEST_NULL;
            MPI_Isend(&pongs_.back(), 1, MPI_INT64_T, status.MPI_SOURCE, pong_tag, comm_, &r);
            MPI_Request_free(&r);
        }
    }

    // The ranks that do not answer a ping within a few seconds.
    // (A ping's send completes on its own: its value lives in pings_; a
    // pong that never came is cancelled, so none lands in freed memory.)
    std::vector<int> silent_ranks() {
        std::vector<std::int64_t> pong(static_cast<std::size_t>(size_), -1);
        std::vector<MPI_Request> receipts(pong.size(), MPI_REQUEST_NULL);
        for (int peer = 0; peer < size_; ++peer) {
            if (peer == rank_) continue;
            pings_.push_back(seq_);
            MPI_Request r = MPI_REQUEST_NULL;
            MPI_Isend(&pings_.back(), 1, MPI_INT64_T, peer, ping_tag, comm_, &r);
            MPI_Request_free(&r);
            MPI_Irecv(&pong[peer], 1, MPI_INT64_T, peer, pong_tag, comm_, &receipts[peer]);
        }
        std::vector<int> answered(pong.size(), 0);
        const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::min(5.0, timeout()));
        answered[rank_] = 1;
        while (std::chrono::steady_clock::now() < until &&
               std::count(answered.begin(), answered.end(), 1) < size_) {
            for (int peer = 0; peer < size_; ++peer)
                if (!answered[peer]) MPI_Test(&receipts[peer], &answered[peer], MPI_STATUS_IGNORE);
            answer_pings();  // another rank that timed out asks this one
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        std::vector<int> silent;
        for (int peer = 0; peer < size_; ++peer)
            if (!answered[peer]) {
                silent.push_back(peer);
                MPI_Cancel(&receipts[peer]);
                MPI_Wait(&receipts[peer], MPI_STATUS_IGNORE);
            }
        return silent;
    }

    std::string timeout_message(const char* what, Waiting waiting) {
        std::string s = "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " waited " +
                        std::to_string(static_cast<int>(timeout())) + " s in the " + what +
                        (waiting == Waiting::collective ? " (collective " : " (after collective ") +
                        std::to_string(seq_) + "); ";
        const std::vector<int> silent = silent_ranks();
        if (silent.empty()) {
            s += "every rank answers, yet the collective did not finish (did the ranks run different programs?)";
        } else {
            s += silent.size() == 1 ? "rank " : "ranks ";
            for (std::size_t i = 0; i < silent.size(); ++i) s += (i ? ", " : "") + std::to_string(silent[i]);
            s += silent.size() == 1 ? " does not answer: it died or hangs" : " do not answer: they died or hang";
        }
        return s + "; the job stops (the last saved training state is intact)";
    }

    void check(int code, const char* what) const {
        if (code == MPI_SUCCESS) return;
        char text[MPI_MAX_ERROR_STRING];
        int length = 0;
        MPI_Error_string(code, text, &length);
        throw Error("rank " + std::to_string(rank_) + ": MPI failed in the " + what + ": " +
                    std::string(text, static_cast<std::size_t>(length)));
    }

    static constexpr int ping_tag = 7101, pong_tag = 7102;
    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1, local_rank_ = 0;
    bool owns_mpi_ = false, aborted_ = false;
    std::int64_t seq_ = 0;
    std::deque<std::int64_t> pings_, pongs_;  // questions and answers in flight (a deque keeps their addresses)
};

// MpiRanks when an MPI launcher started this process, else the single
// process. Under mpirun, the host backend's kernels share the node's cores
// among its ranks (SNUG_HOST_THREADS, unless set, becomes cores / ranks here).
inline std::unique_ptr<Ranks> join_ranks(int* argc, char*** argv) {
    if (!launched_by_mpi()) return std::make_unique<SingleProcess>();
    if (std::getenv("SNUG_HOST_THREADS") == nullptr) {
        if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) {
            const long ranks_here = std::max(1L, std::strtol(local, nullptr, 10));
            const long cores = std::max(1L, static_cast<long>(std::thread::hardware_concurrency()));
            setenv("SNUG_HOST_THREADS", std::to_string(std::max(1L, cores / ranks_here)).c_str(), 1);
        }
    }
    return std::make_unique<MpiRanks>(argc, argv);
}

}  // namespace snug::dist
