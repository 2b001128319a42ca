// A small fork-join parallel-for for the host kernels: split the work into
// independent tasks, run them on a few threads, wait for all. The threads are
// kept for the life of the program, so a call costs a wake-up (microseconds),
// not thread starts.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace snug::host {

// How many threads a host kernel may use: the environment variable
// SNUG_HOST_THREADS when it holds a positive number, else the hardware's
// concurrency (at least 1). Read once, on first use.
inline unsigned max_threads() noexcept {
    static const unsigned n = [] {
        if (const char* env = std::getenv("SNUG_HOST_THREADS")) {
            const long v = std::strtol(env, nullptr, 10);
            if (v > 0) return static_cast<unsigned>(std::min(v, 1024L));
        }
        return std::max(1U, std::thread::hardware_concurrency());
    }();
    return n;
}

namespace detail {

// max_threads() - 1 worker threads, started on first use and joined at exit.
// One parallel_for at a time runs on them; a call that finds them busy
// (another thread's call, or a call made from inside a task) gets no helpers.
class WorkerPool {
public:
    explicit WorkerPool(unsigned workers) {
        threads_.reserve(workers);
        try {
            for (unsigned i = 0; i < workers; ++i) threads_.emplace_back([this, i] { work(i); });
        } catch (...) {
            // Could not start them all: the pool works with those it has.
        }
    }
    WorkerPool(const WorkerPool&) = delete;
    WorkerPool& operator=(const WorkerPool&) = delete;
    ~WorkerPool() {
        {
            const std::lock_guard lock(mutex_);
            stop_ = true;
        }
        wake_.notify_all();
        for (auto& t : threads_) t.join();
    }

    // Runs body() on the calling thread and on up to `helpers` workers at
    // once, returning when every copy has returned. body must not throw.
    // Without free workers it runs body() on the calling thread alone.
    template <class Body>
    void run(unsigned helpers, Body& body) {
        bool idle = false;
        helpers = std::min<unsigned>(helpers, static_cast<unsigned>(threads_.size()));
        if (helpers == 0 || !busy_.compare_exchange_strong(idle, true)) {
            body();
            return;
        }
        {
            const std::lock_guard lock(mutex_);
            job_ = &body;
            invoke_ = [](void* b) { (*static_cast<Body*>(b))(); };
            helpers_ = helpers;
            running_ = helpers;
            ++generation_;
        }
        wake_.notify_all();
        body();
        {
            std::unique_lock lock(mutex_);
            done_.wait(lock, [this] { return running_ == 0; });
        }
        busy_ = false;
    }

private:
    void work(unsigned index) {
        std::uint64_t seen = 0;
        std::unique_lock lock(mutex_);
        for (;;) {
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            if (index >= helpers_) continue;  // not needed this time
            void* job = job_;
            void (*invoke)(void*) = invoke_;
            lock.unlock();
            invoke(job);
            lock.lock();
            if (--running_ == 0) done_.notify_one();
        }
    }

    std::vector<std::thread> threads_;
    std::atomic<bool> busy_{false};
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    // Guarded by mutex_:
    void* job_ = nullptr;
    void (*invoke_)(void*) = nullptr;
    unsigned helpers_ = 0, running_ = 0;
    std::uint64_t generation_ = 0;
    bool stop_ = false;
};

inline WorkerPool& worker_pool() {
    static WorkerPool pool(max_threads() - 1);
    return pool;
}

}  // namespace detail

// Calls fn(task) once for every task in [0, n_tasks), on up to `threads`
// threads (the calling thread and the shared workers; fewer while another
// parallel_for holds them). Tasks are handed out one at a time in increasing
// order, so uneven tasks balance. Returns when every task has finished; if a
// task threw, the first exception is rethrown here (tasks not yet started are
// then skipped). A task may itself call parallel_for: that call runs on its
// own thread alone.
template <class F>
void parallel_for(std::int64_t n_tasks, unsigned threads, F&& fn) {
    if (n_tasks <= 0) return;
    if (threads <= 1 || n_tasks == 1) {
        for (std::int64_t t = 0; t < n_tasks; ++t) fn(t);
        return;
    }
    std::atomic<std::int64_t> next{0};
    std::exception_ptr error;
    std::mutex error_mutex;
    auto body = [&]() noexcept {
        for (std::int64_t t = next++; t < n_tasks; t = next++) {
            try {
                fn(t);
            } catch (...) {
                const std::lock_guard lock(error_mutex);
                if (!error) error = std::current_exception();
                next = n_tasks;  // stop handing out tasks
            }
        }
    };
    const auto helpers = static_cast<unsigned>(std::min<std::int64_t>(threads, n_tasks) - 1);
    detail::worker_pool().run(helpers, body);
    if (error) std::rethrow_exception(error);
}

}  // namespace snug::host
