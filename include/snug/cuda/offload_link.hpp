// Optimizer offload on the CUDA backend (optim/offload.hpp): page-locked host
// memory for the staging buffers (PinnedHost, a device tag whose memory the
// GPU copies to and from asynchronously), and the link, a second stream that
// carries the gradients to the host and the updated weights back while the
// CPU computes, with the events that order it against the compute stream.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "snug/core/bytes.hpp"
#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"

namespace snug::cuda {

// Page-locked host memory (cudaHostAlloc): host memory the GPU reads and
// writes by DMA, so that a cudaMemcpyAsync on it overlaps other work. Only
// the offload's staging buffers live here: pinning is a scarce resource.
struct PinnedHost {
    static constexpr const char* name = "pinned host";
    static constexpr std::size_t alignment = 256;

    static void* allocate(std::size_t bytes) {
        if (bytes == 0) return nullptr;
        void* p = nullptr;
        const cudaError_t status = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
        if (status == cudaSuccess) return p;
        (void)cudaGetLastError();
        throw OutOfMemory("cudaHostAlloc of " + format_bytes(bytes) + " (" + std::to_string(bytes) +
                          " bytes) of page-locked host memory failed (" + detail::describe(status) + ")");
    }
    static void deallocate(void* p) noexcept {
        if (p == nullptr) return;
        if (cudaFreeHost(p) != cudaSuccess) (void)cudaGetLastError();
    }
    void synchronize() const noexcept {}
};

// The second stream of an offloaded update and its events. The protocol, as
// optim/offload.hpp drives it for one update:
//   begin(dev)                  the gradients queued on dev.stream are final
//   download(slot, ...)         gradient chunks to the host, each into a slot
//   wait(slot)                  the CPU waits for that slot's chunk only
//   upload(...)                 updated weight chunks back to the device
//   end(dev)                    dev.stream waits for the last upload
// Every copy is queued in order on the link's stream, so a slot's next
// download follows every upload issued before it.
class OffloadLink {
public:
    using host_device = snug::host::Device;  // where the offloaded state lives and the update runs
    using pinned_device = PinnedHost;        // the staging buffers
    static constexpr bool shares_memory = false;
    static constexpr int slots = 2;  // gradient chunks in flight: one computed on, one arriving

    OffloadLink() {
        check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
        check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
        for (cudaEvent_t& e : arrived_) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    OffloadLink(const OffloadLink&) = delete;
    OffloadLink& operator=(const OffloadLink&) = delete;
    ~OffloadLink() {
        for (cudaEvent_t e : arrived_) (void)cudaEventDestroy(e);
        (void)cudaEventDestroy(done_);
        (void)cudaEventDestroy(ready_);
        (void)cudaStreamDestroy(stream_);
    }

    void begin(const Device& dev) {
        check(cudaEventRecord(ready_, dev.stream));
        check(cudaStreamWaitEvent(stream_, ready_, 0));
    }
    // host (n, pinned) <- device (n), queued; wait(slot) waits for it.
    template <class T>
    void download(int slot, T* host, const T* device, std::int64_t n) {
        static_assert(std::is_trivially_copyable_v<T>);
        check(cudaMemcpyAsync(host, device, static_cast<std::size_t>(n) * sizeof(T), cudaMemcpyDeviceToHost, stream_));
        check(cudaEventRecord(arrived_[slot], stream_));
    }
    void wait(int slot) { check(cudaEventSynchronize(arrived_[slot])); }
    // device (n) <- host (n, pinned), queued; host must not change until end().
    template <class T>
    void upload(T* device, const T* host, std::int64_t n) {
        static_assert(std::is_trivially_copyable_v<T>);
        check(cudaMemcpyAsync(device, host, static_cast<std::size_t>(n) * sizeof(T), cudaMemcpyHostToDevice, stream_));
    }
    void end(const Device& dev) {
        check(cudaEventRecord(done_, stream_));
        check(cudaStreamWaitEvent(dev.stream, done_, 0));
    }

private:
    cudaStream_t stream_ = nullptr;
    cudaEvent_t ready_ = nullptr, done_ = nullptr;
    cudaEvent_t arrived_[slots] = {};
};

}  // namespace snug::cuda
