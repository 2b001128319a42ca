// Buffer<T, D>: an owning, move-only array of T in device D's memory, recorded
// in a MemoryTracker for as long as it lives.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/core/memory_tracker.hpp"

namespace snug {

// T: the element type; trivially copyable, because elements are raw bytes
//    (never constructed, left uninitialised).
// D: the device tag whose allocate/deallocate own the storage.
//
// The constructor records count * sizeof(T) bytes in the tracker first (so an
// over-budget request throws OutOfMemory with nothing allocated), then
// allocates; if the allocation fails the record is undone and the error
// propagates. The destructor, reset() and move-assignment give both back. A
// buffer of 0 elements records 0 bytes and has data() == nullptr. The tracker
// must outlive the buffer.
template <class T, DeviceTag D>
class Buffer {
    static_assert(std::is_trivially_copyable_v<T>, "snug::Buffer holds raw bytes: T must be trivially copyable");
    static constexpr bool device_aligns_T() {
        if constexpr (requires { D::alignment; })
            return alignof(T) <= D::alignment;
        else
            return alignof(T) <= alignof(std::max_align_t);
    }
    static_assert(device_aligns_T(), "snug::Buffer: the device's allocation alignment is too small for T");

public:
    using value_type = T;
    using device_type = D;

    // An empty buffer attached to no tracker.
    Buffer() noexcept = default;

    Buffer(MemoryTracker& tracker, MemoryCategory category, std::size_t count, std::string_view what)
        : tracker_(&tracker), category_(category) {
        if (count > std::numeric_limits<std::size_t>::max() / sizeof(T))
            throw OutOfMemory("out of memory: \"" + std::string(what) + "\" asks for " + std::to_string(count) +
                              " elements of " + std::to_string(sizeof(T)) + " bytes, more than SIZE_MAX bytes");
        std::size_t bytes = count * sizeof(T);
        tracker.allocate(category, bytes, what);
        if (bytes > 0) {
            void* raw = nullptr;
            try {
                raw = D::allocate(bytes);
            } catch (...) {
                tracker.release(category, bytes);
                throw;
            }
            if (raw == nullptr) {
                tracker.release(category, bytes);
                throw OutOfMemory("out of memory: " + std::string(D::name) + " allocation of " +
                                  format_bytes(bytes) + " for \"" + std::string(what) + "\" returned nothing");
            }
            data_ = static_cast<T*>(raw);
        }
        count_ = count;
    }

    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;

    Buffer(Buffer&& other) noexcept
        : tracker_(std::exchange(other.tracker_, nullptr)),
          category_(other.category_),
          data_(std::exchange(other.data_, nullptr)),
          count_(std::exchange(other.count_, 0)) {}

    // Gives back what this buffer held, then takes over `other`'s storage.
    Buffer& operator=(Buffer&& other) noexcept {
        if (this != &other) {
            reset();
            tracker_ = std::exchange(other.tracker_, nullptr);
            category_ = other.category_;
            data_ = std::exchange(other.data_, nullptr);
            count_ = std::exchange(other.count_, 0);
        }
        return *this;
    }

    ~Buffer() { reset(); }

    // Frees the storage and its record now; the buffer becomes empty.
    void reset() noexcept {
        if (data_ != nullptr) D::deallocate(data_);
        // Cannot throw: these bytes were recorded by this buffer's constructor.
        if (tracker_ != nullptr && count_ > 0) tracker_->release(category_, bytes());
        data_ = nullptr;
        count_ = 0;
    }

    T* data() noexcept { return data_; }  // (size())
    const T* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return count_; }
    std::size_t bytes() const noexcept { return count_ * sizeof(T); }
    bool empty() const noexcept { return count_ == 0; }
    MemoryCategory category() const noexcept { return category_; }

private:
    MemoryTracker* tracker_ = nullptr;
    MemoryCategory category_ = MemoryCategory::temporaries;
    T* data_ = nullptr;
    std::size_t count_ = 0;
};

}  // namespace snug
