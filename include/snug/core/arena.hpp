// ActivationArena<D>: stack-like storage for what the forward pass saves for
// the backward pass. Forward pushes, backward pops in reverse; a checkpointed
// block drops everything it pushed since a mark.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "snug/core/bytes.hpp"
#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/core/memory_tracker.hpp"

namespace snug {

// D: the device tag whose allocate/deallocate provide the chunks.
//
// Two kinds of bytes, kept apart on purpose:
// - Logical bytes: every push records exactly count * sizeof(T) bytes in the
//   tracker under the arena's category (MemoryCategory::activations unless the
//   constructor says otherwise: a trainer keeps a second arena for the
//   backward pass's temporaries) and pop gives them back, so the
//   tracker's activation peak is the high-water mark of live pushed bytes, to
//   the byte (alignment padding is not counted).
// - Reserved bytes: the chunks behind the pushes, allocated lazily through
//   D::allocate, each max(request, chunk_bytes) rounded up to 256 bytes
//   (chunk_bytes defaults to 64 MiB). Chunks are never moved, so a pushed
//   pointer stays valid until it is popped; they are reused from step to step
//   and freed only by the destructor. They are NOT in the tracker (which holds
//   logical bytes); reserved_bytes() reports them, and on CUDA the report
//   shows the difference through the driver's free-memory figure.
// Every push is 256-byte aligned: cuBLASLt needs 16, and 256 is what
// cudaMalloc itself gives.
// Like the tracker it writes to, an arena belongs to one training loop (not
// thread-safe), and the tracker must outlive it.
template <DeviceTag D>
class ActivationArena {
public:
    static constexpr std::size_t alignment = 256;
    static constexpr std::size_t default_chunk_bytes = std::size_t{64} << 20;

    // A position in the stack, to release back to (see release_to).
    struct Mark {
        std::size_t depth = 0;
        std::uint64_t serial = 0;  // the push at depth - 1, so a stale mark is caught
    };

    explicit ActivationArena(MemoryTracker& tracker, std::size_t chunk_bytes = default_chunk_bytes,
                             MemoryCategory category = MemoryCategory::activations)
        : tracker_(&tracker), category_(category), chunk_bytes_(chunk_bytes) {
        if (chunk_bytes == 0 || chunk_bytes > max_request)
            throw ConfigError("ActivationArena: chunk size " + std::to_string(chunk_bytes) + " bytes is out of range");
    }

    ActivationArena(const ActivationArena&) = delete;
    ActivationArena& operator=(const ActivationArena&) = delete;

    ActivationArena(ActivationArena&& other) noexcept
        : tracker_(other.tracker_),
          category_(other.category_),
          chunk_bytes_(other.chunk_bytes_),
          chunks_(std::move(other.chunks_)),
          entries_(std::move(other.entries_)),
          chunk_(std::exchange(other.chunk_, 0)),
          offset_(std::exchange(other.offset_, 0)),
          live_bytes_(std::exchange(other.live_bytes_, 0)),
          next_serial_(other.next_serial_) {
        other.chunks_.clear();
        other.entries_.clear();
    }

    // Gives back everything this arena held, then takes over `other`'s.
    ActivationArena& operator=(ActivationArena&& other) noexcept {
        if (this != &other) {
            free_all();
            tracker_ = other.tracker_;
            category_ = other.category_;
            chunk_bytes_ = other.chunk_bytes_;
            chunks_ = std::move(other.chunks_);
            entries_ = std::move(other.entries_);
            chunk_ = std::exchange(other.chunk_, 0);
            offset_ = std::exchange(other.offset_, 0);
            live_bytes_ = std::exchange(other.live_bytes_, 0);
            next_serial_ = other.next_serial_;
            other.chunks_.clear();
            other.entries_.clear();
        }
        return *this;
    }

    // Releases what is still pushed from the tracker and frees every chunk.
    ~ActivationArena() { free_all(); }

    // Room for `count` elements of T (uninitialised, 256-byte aligned) until
    // popped. Records the bytes first: over the budget it throws OutOfMemory
    // and nothing changes; if a new chunk cannot be allocated the record is
    // undone and the error propagates. count == 0 is a valid push that must
    // be popped like any other.
    template <class T>
    T* push(std::size_t count, std::string_view what) {
        static_assert(std::is_trivially_copyable_v<T>, "ActivationArena holds raw bytes: T must be trivially copyable");
        static_assert(alignof(T) <= alignment, "ActivationArena aligns to 256 bytes: T needs more");
        if (count > max_request / sizeof(T))
            throw OutOfMemory("out of memory: activation \"" + std::string(what) + "\" asks for " +
                              std::to_string(count) + " elements of " + std::to_string(sizeof(T)) +
                              " bytes, more than an arena can hold");
        std::size_t bytes = count * sizeof(T);
        tracker_->allocate(category_, bytes, what);
        try {
            entries_.reserve(entries_.size() + 1);
            auto [chunk, start] = place(bytes);
            std::byte* base = chunks_.empty() ? nullptr : chunks_[chunk].base;
            std::byte* p = base == nullptr ? nullptr : base + start;
            entries_.push_back(Entry{p, bytes, chunk_, offset_, next_serial_++, std::string(what)});
            if (bytes > 0) {
                chunk_ = chunk;
                offset_ = start + bytes;
            }
            live_bytes_ += bytes;
            return reinterpret_cast<T*>(p);
        } catch (...) {
            tracker_->release(category_, bytes);
            throw;
        }
    }

    // Gives back the most recent live push, which `p` must be; anything else
    // throws snug::Error naming both and changes nothing.
    void pop(const void* p) {
        if (entries_.empty())
            throw Error("ActivationArena::pop: " + describe_pointer(p) + " popped, but nothing is pushed");
        const Entry& top = entries_.back();
        if (p != top.ptr) {
            std::string popped = describe_pointer(p);
            auto live = std::find_if(entries_.begin(), entries_.end(), [p](const Entry& e) { return e.ptr == p; });
            popped += live == entries_.end() ? " (not a live push)" : " (\"" + live->what + "\")";
            throw Error("ActivationArena::pop: " + popped + " is not the most recent live push; that is " +
                        describe_pointer(top.ptr) + " (\"" + top.what + "\")");
        }
        pop_top();
    }

    // The current top of the stack.
    Mark mark() const noexcept {
        return Mark{entries_.size(), entries_.empty() ? 0 : entries_.back().serial};
    }

    // Pops everything pushed since `m`. A mark whose pushes were already
    // popped (the stack went below it) throws snug::Error and changes nothing.
    void release_to(Mark m) {
        bool stale = m.depth > entries_.size() || (m.depth > 0 && entries_[m.depth - 1].serial != m.serial);
        if (stale)
            throw Error("ActivationArena::release_to: the mark at depth " + std::to_string(m.depth) +
                        " is stale (the stack went below it); depth is now " + std::to_string(entries_.size()));
        while (entries_.size() > m.depth) pop_top();
    }

    // After a layer's backward: throws snug::Error naming `owner` (the layer)
    // when the arena is not back at `m`, the mark taken just before that
    // layer's forward — because the backward left pushes of its forward live
    // (each is named, with its label and bytes), or popped pushes that were
    // not its own. Changes nothing.
    void expect_released_to(Mark m, std::string_view owner) const {
        const bool below = m.depth > entries_.size() || (m.depth > 0 && entries_[m.depth - 1].serial != m.serial);
        if (below)
            throw Error(std::string(owner) + ": its backward popped activations that its forward did not push "
                        "(the arena is below where it stood before that forward)");
        if (entries_.size() == m.depth) return;
        std::string live;
        for (std::size_t i = m.depth; i < entries_.size(); ++i)
            live += (i == m.depth ? "\"" : ", \"") + entries_[i].what + "\" (" + format_bytes(entries_[i].bytes) + ")";
        const std::size_t n = entries_.size() - m.depth;
        throw Error(std::string(owner) + ": its backward left " + std::to_string(n) +
                    (n == 1 ? " activation" : " activations") + " of its forward live: " + live +
                    "; a layer's backward must pop everything its forward pushed, in reverse order");
    }

    // Pops everything.
    void clear() noexcept {
        while (!entries_.empty()) pop_top();
    }

    // Logical bytes pushed and not yet popped (what the tracker holds for us).
    std::size_t live_bytes() const noexcept { return live_bytes_; }
    MemoryCategory category() const noexcept { return category_; }
    // Pushes not yet popped.
    std::size_t depth() const noexcept { return entries_.size(); }
    // Bytes allocated from D for the chunks (including alignment slack).
    std::size_t reserved_bytes() const noexcept {
        std::size_t total = 0;
        for (const Chunk& c : chunks_) total += c.raw_bytes;
        return total;
    }
    std::size_t chunk_count() const noexcept { return chunks_.size(); }
    std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }

private:
    // Room for alignment rounding on top of any accepted request.
    static constexpr std::size_t max_request = std::numeric_limits<std::size_t>::max() / 2;
    // D's allocations are already 256-aligned (cudaMalloc) or need this slack.
    static constexpr std::size_t slack() {
        if constexpr (requires { D::alignment; })
            if (D::alignment >= alignment && D::alignment % alignment == 0) return 0;
        return alignment - 1;
    }
    static constexpr std::size_t align_up(std::size_t n) { return (n + alignment - 1) / alignment * alignment; }

    struct Chunk {
        void* raw;          // what D::allocate returned
        std::byte* base;    // raw rounded up to 256 bytes
        std::size_t capacity;   // usable bytes from base, a multiple of 256
        std::size_t raw_bytes;  // capacity + slack
    };
    struct Entry {
        std::byte* ptr;
        std::size_t bytes;
        std::size_t chunk_before;   // the cursor before this push, restored by pop
        std::size_t offset_before;
        std::uint64_t serial;
        std::string what;
    };

    // Where `bytes` go: (chunk index, offset). May append a chunk; moves nothing.
    std::pair<std::size_t, std::size_t> place(std::size_t bytes) {
        if (!chunks_.empty()) {
            const Chunk& current = chunks_[chunk_];
            std::size_t start = std::min(align_up(offset_), current.capacity);
            if (bytes <= current.capacity - start) return {chunk_, start};
        }
        if (bytes == 0) return {chunk_, 0};  // no chunk yet: a null pointer
        // The chunks after the current one hold nothing live: reuse the first
        // that is large enough, or append a new one.
        for (std::size_t j = chunks_.empty() ? 0 : chunk_ + 1; j < chunks_.size(); ++j)
            if (chunks_[j].capacity >= bytes) return {j, 0};
        std::size_t capacity = align_up(std::max(bytes, chunk_bytes_));
        std::size_t raw_bytes = capacity + slack();
        chunks_.reserve(chunks_.size() + 1);
        void* raw = D::allocate(raw_bytes);
        if (raw == nullptr)
            throw OutOfMemory("out of memory: " + std::string(D::name) + " allocation of an activation chunk of " +
                              format_bytes(raw_bytes) + " returned nothing");
        auto address = reinterpret_cast<std::uintptr_t>(raw);
        auto aligned = (address + alignment - 1) / alignment * alignment;
        std::byte* base = static_cast<std::byte*>(raw) + (aligned - address);
        chunks_.push_back(Chunk{raw, base, capacity, raw_bytes});
        return {chunks_.size() - 1, 0};
    }

    void pop_top() noexcept {
        const Entry& top = entries_.back();
        // Cannot throw: these bytes were recorded by push.
        tracker_->release(category_, top.bytes);
        live_bytes_ -= top.bytes;
        chunk_ = top.chunk_before;
        offset_ = top.offset_before;
        entries_.pop_back();
    }

    void free_all() noexcept {
        clear();
        for (const Chunk& c : chunks_) D::deallocate(c.raw);
        chunks_.clear();
        chunk_ = 0;
        offset_ = 0;
    }

    static std::string describe_pointer(const void* p) {
        std::ostringstream out;
        out << p;
        return out.str();
    }

    MemoryTracker* tracker_;
    MemoryCategory category_;
    std::size_t chunk_bytes_;
    std::vector<Chunk> chunks_;
    std::vector<Entry> entries_;
    std::size_t chunk_ = 0;   // the cursor: the chunk of the last live push
    std::size_t offset_ = 0;  // and the end of that push within it
    std::size_t live_bytes_ = 0;
    std::uint64_t next_serial_ = 1;
};

}  // namespace snug
