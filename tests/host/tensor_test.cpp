// Shapes and tensor views: element counts, strides, checked reshapes, slices
// and indexing, and the ShapeError messages that name both shapes.
#include <catch2/catch.hpp>

#include <numeric>
#include <string>
#include <vector>

#include "snug/core/tensor.hpp"

using snug::Shape;
using snug::ShapeError;
using snug::TensorView;

TEST_CASE("Shape reports rank, extents, element count, strides and text") {
    const Shape s{2, 3, 4};
    CHECK(s.rank() == 3);
    CHECK(s[0] == 2);
    CHECK(s[2] == 4);
    CHECK(s.numel() == 24);
    CHECK(s.stride(0) == 12);
    CHECK(s.stride(1) == 4);
    CHECK(s.stride(2) == 1);
    CHECK(s.str() == "(2, 3, 4)");
    CHECK(Shape{}.numel() == 1);
    CHECK(Shape{}.str() == "()");
    CHECK(Shape{5, 0}.numel() == 0);
    CHECK(s == Shape{2, 3, 4});
    CHECK_FALSE(s == Shape{2, 3});
    CHECK_FALSE(s == Shape{2, 3, 5});
    CHECK_THROWS_AS(s[3], ShapeError);
    CHECK_THROWS_AS(s[-1], ShapeError);
    CHECK_THROWS_AS((Shape{1, 2, 3, 4, 5}), ShapeError);
    CHECK_THROWS_AS((Shape{2, -1}), ShapeError);
}

TEST_CASE("reshape keeps the memory and checks the element count") {
    std::vector<float> data(24);
    std::iota(data.begin(), data.end(), 0.0f);
    TensorView<float> t(data.data(), {2, 3, 4});
    auto r = t.reshape({6, 4});
    CHECK(r.data() == data.data());
    CHECK(r.shape() == Shape{6, 4});
    try {
        (void)t.reshape({5, 5});
        FAIL("reshape to a different element count must throw");
    } catch (const ShapeError& e) {
        const std::string msg = e.what();
        CHECK(msg.find("(2, 3, 4)") != std::string::npos);
        CHECK(msg.find("(5, 5)") != std::string::npos);
    }
}

TEST_CASE("slice and index select rows of dimension 0") {
    std::vector<float> data(24);
    std::iota(data.begin(), data.end(), 0.0f);
    TensorView<float> t(data.data(), {2, 3, 4});
    auto second = t[1];
    CHECK(second.shape() == Shape{3, 4});
    CHECK(second.data()[0] == 12.0f);
    auto rows = t.reshape({6, 4}).slice(2, 5);
    CHECK(rows.shape() == Shape{3, 4});
    CHECK(rows.data()[0] == 8.0f);
    CHECK(t.slice(1, 1).numel() == 0);
    CHECK_THROWS_AS(t.slice(1, 3), ShapeError);
    CHECK_THROWS_AS(t.slice(-1, 1), ShapeError);
    CHECK_THROWS_AS(t[2], ShapeError);
    TensorView<const float> c = t;  // read-only conversion
    CHECK(c.data() == data.data());
    CHECK(c.bytes() == 24 * sizeof(float));
}

TEST_CASE("expect_shape and expect_same_shape name the tensors and both shapes") {
    std::vector<float> a(8), b(8);
    TensorView<float> x(a.data(), {2, 4});
    TensorView<float> y(b.data(), {4, 2});
    CHECK_NOTHROW(snug::expect_shape(x, {2, 4}, "x"));
    try {
        snug::expect_shape(x, {2, 5}, "attention input");
        FAIL("expect_shape must throw");
    } catch (const ShapeError& e) {
        CHECK(std::string(e.what()) == "attention input: expected (2, 5), got (2, 4)");
    }
    try {
        snug::expect_same_shape(x, "dout", y, "out");
        FAIL("expect_same_shape must throw");
    } catch (const ShapeError& e) {
        CHECK(std::string(e.what()) == "dout (2, 4) and out (4, 2) must have the same shape");
    }
}
