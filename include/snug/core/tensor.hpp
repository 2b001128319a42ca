// Tensor views: a pointer, a shape of up to four dimensions, and the device the
// memory lives on (a type parameter). Views own nothing and do no arithmetic;
// layers own explicit forward and backward. Reshapes and slices are checked,
// and a mismatch throws snug::ShapeError naming both shapes.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>

#include "snug/core/device.hpp"
#include "snug/core/error.hpp"

namespace snug {

inline constexpr int max_rank = 4;

// Up to four non-negative extents, outermost first; row-major (contiguous) layout.
class Shape {
public:
    Shape() = default;
    Shape(std::initializer_list<std::int64_t> dims) {
        if (dims.size() > static_cast<std::size_t>(max_rank))
            throw ShapeError("a shape has at most 4 dimensions, got " + std::to_string(dims.size()));
        for (std::int64_t d : dims) {
            if (d < 0) throw ShapeError("negative extent " + std::to_string(d) + " in a shape");
            dims_[static_cast<std::size_t>(rank_++)] = d;
        }
    }

    int rank() const { return rank_; }
    std::int64_t operator[](int dim) const {
        // The bound is tested here, not in a helper, so that the compiler
        // sees the guarded access (GCC 12 with sanitizers warns otherwise).
        if (dim < 0 || dim >= rank_) throw_bad_dim(dim);
        return dims_[static_cast<std::size_t>(dim)];
    }
    std::int64_t numel() const {
        std::int64_t n = 1;
        for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<std::size_t>(i)];
        return n;
    }
    // Elements between consecutive indices of dimension `dim`.
    std::int64_t stride(int dim) const {
        if (dim < 0 || dim >= rank_) throw_bad_dim(dim);
        std::int64_t s = 1;
        for (int i = rank_ - 1; i > dim; --i) s *= dims_[static_cast<std::size_t>(i)];
        return s;
    }
    // The same shape with dimension 0 replaced.
    Shape with_outer(std::int64_t outer) const {
        Shape s = *this;
        s.dims_[0] = outer;
        return s;
    }
    // The shape without its outermost dimension.
    Shape inner() const {
        Shape s;
        for (int i = 1; i < rank_; ++i) s.dims_[static_cast<std::size_t>(s.rank_++)] = dims_[static_cast<std::size_t>(i)];
        return s;
    }

    // "(2, 64, 768)"; "()" for a scalar.
    std::string str() const {
        std::string s = "(";
        for (int i = 0; i < rank_; ++i) {
            if (i > 0) s += ", ";
            s += std::to_string(dims_[static_cast<std::size_t>(i)]);
        }
        return s + ")";
    }

    friend bool operator==(const Shape& a, const Shape& b) {
        if (a.rank_ != b.rank_) return false;
        for (int i = 0; i < a.rank_; ++i)
            if (a.dims_[static_cast<std::size_t>(i)] != b.dims_[static_cast<std::size_t>(i)]) return false;
        return true;
    }

private:
    [[noreturn]] void throw_bad_dim(int dim) const {
        throw ShapeError("dimension " + std::to_string(dim) + " out of range for shape " + str());
    }

    std::array<std::int64_t, max_rank> dims_{};
    int rank_ = 0;
};

// A non-owning view of contiguous row-major memory on device D.
//   T: element type (const T for a read-only view)
//   D: device tag (snug::Host, snug::Cuda); says where `data` may be dereferenced
template <class T, DeviceTag D = Host>
class TensorView {
public:
    using element_type = T;
    using device_type = D;

    TensorView() = default;
    TensorView(T* data, Shape shape) : data_(data), shape_(shape) {}

    // A view of mutable data converts to a read-only one.
    template <class U>
        requires std::same_as<const U, T> && (!std::is_const_v<U>)
    TensorView(const TensorView<U, D>& other) : data_(other.data()), shape_(other.shape()) {}

    T* data() const { return data_; }
    const Shape& shape() const { return shape_; }
    int rank() const { return shape_.rank(); }
    std::int64_t size(int dim) const { return shape_[dim]; }
    std::int64_t numel() const { return shape_.numel(); }
    std::size_t bytes() const { return static_cast<std::size_t>(numel()) * sizeof(T); }
    bool empty() const { return numel() == 0; }

    // The same memory under another shape with the same element count.
    TensorView reshape(Shape to) const {
        if (to.numel() != numel())
            throw ShapeError("cannot reshape " + shape_.str() + " (" + std::to_string(numel()) +
                             " elements) to " + to.str() + " (" + std::to_string(to.numel()) + " elements)");
        return {data_, to};
    }

    // Rows [begin, end) of dimension 0; still contiguous.
    TensorView slice(std::int64_t begin, std::int64_t end) const {
        if (rank() == 0) throw ShapeError("cannot slice a scalar view");
        if (begin < 0 || end < begin || end > size(0))
            throw ShapeError("slice [" + std::to_string(begin) + ", " + std::to_string(end) +
                             ") out of range for dimension 0 of " + shape_.str());
        return {data_ + begin * shape_.stride(0), shape_.with_outer(end - begin)};
    }

    // Index `i` of dimension 0, as a view of rank one less.
    TensorView operator[](std::int64_t i) const {
        if (rank() == 0) throw ShapeError("cannot index a scalar view");
        if (i < 0 || i >= size(0))
            throw ShapeError("index " + std::to_string(i) + " out of range for dimension 0 of " + shape_.str());
        return {data_ + i * shape_.stride(0), shape_.inner()};
    }

private:
    T* data_ = nullptr;
    Shape shape_;
};

// Throws ShapeError unless `t` has exactly the shape `expected`; `what` names
// the tensor in the message: "attention input: expected (2, 64, 768), got (2, 64, 512)".
template <class T, DeviceTag D>
void expect_shape(const TensorView<T, D>& t, const Shape& expected, std::string_view what) {
    if (!(t.shape() == expected))
        throw ShapeError(std::string(what) + ": expected " + expected.str() + ", got " + t.shape().str());
}

// Throws ShapeError unless two tensors have the same shape.
template <class A, class B, DeviceTag D>
void expect_same_shape(const TensorView<A, D>& a, std::string_view what_a, const TensorView<B, D>& b,
                       std::string_view what_b) {
    if (!(a.shape() == b.shape()))
        throw ShapeError(std::string(what_a) + " " + a.shape().str() + " and " + std::string(what_b) + " " +
                         b.shape().str() + " must have the same shape");
}

}  // namespace snug
