// A host allocation that fails names what it was for and how many bytes,
// instead of the bare "std::bad_alloc".
#include <catch2/catch.hpp>

#include <cstddef>
#include <new>
#include <vector>

#include "snug/train/host_allocation.hpp"
#include "snug/train/model_source.hpp"

TEST_CASE("host allocation: bad_alloc and length_error become OutOfMemory naming the allocation and its bytes") {
    CHECK_THROWS_AS(snug::name_allocation("x", 1, []() -> int { throw std::bad_alloc(); }), snug::OutOfMemory);
    CHECK_THROWS_WITH(snug::name_allocation("the initial fp32 weights", std::size_t{3} << 30,
                                            []() -> int { throw std::bad_alloc(); }),
                      "out of host memory: cannot allocate 3.00 GiB (3221225472 bytes) for the initial fp32 weights");
    // A size no vector can hold ends in length_error before anything is allocated.
    const std::size_t too_many = std::vector<float>().max_size() + 1;
    CHECK_THROWS_WITH(snug::name_allocation("a vector", too_many, [&] { return std::vector<float>(too_many); }),
                      Catch::StartsWith("out of host memory: cannot allocate") && Catch::EndsWith("for a vector"));
    // What succeeds passes through untouched.
    CHECK(snug::name_allocation("seven", 4, [] { return 7; }) == 7);
}
