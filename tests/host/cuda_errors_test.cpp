// snug/cuda/check.hpp from a plain g++ translation unit: failed CUDA and
// cuBLAS statuses become snug::CudaError naming the call site, a missing GPU
// becomes snug::NoCudaDevice saying so, and nothing touches CUDA before main
// (catch_discover_tests runs this binary at build time, GPU or not).
#define CATCH_CONFIG_EXTERNAL_INTERFACES  // for the event listener below
#include <catch2/catch.hpp>

#if defined(SNUG_TEST_HAVE_CUDA_HEADERS)

#include <cuda_runtime_api.h>

#include <fstream>
#include <string>

#include "snug/core/error.hpp"
#include "snug/cuda/check.hpp"

using Catch::Matchers::Contains;

namespace {

// Whether the CUDA driver library is loaded into this process. The runtime
// loads it on its first initialising call, so "not loaded when the test run
// starts" means no CUDA call happened during static initialisation.
bool driver_library_loaded() {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line))
        if (line.find("/libcuda.so") != std::string::npos) return true;
    return false;
}

bool driver_loaded_at_start = true;

// Catch2 calls testRunStarting after static initialisation and before the
// first test case, whatever order or filter the tests run with.
struct DriverAtStart : Catch::TestEventListenerBase {
    using TestEventListenerBase::TestEventListenerBase;
    void testRunStarting(const Catch::TestRunInfo& info) override {
        driver_loaded_at_start = driver_library_loaded();
        TestEventListenerBase::testRunStarting(info);
    }
};

// The runtime's own view, for cross-checking device_count().
int raw_device_count() {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    (void)cudaGetLastError();
    return status == cudaSuccess ? count : 0;
}

}  // namespace

CATCH_REGISTER_LISTENER(DriverAtStart)

TEST_CASE("no CUDA call happens during static initialisation") {
    CHECK_FALSE(driver_loaded_at_start);
    // Where a GPU exists, the probe is live: the first runtime call loads the driver.
    if (raw_device_count() > 0) CHECK(driver_library_loaded());
}

TEST_CASE("device_count and require_device say whether a GPU exists") {
    const int count = snug::cuda::device_count();
    CHECK(count == raw_device_count());
    if (count == 0) {
        std::string message;
        const std::string line = std::to_string(__LINE__ + 2);
        try {
            snug::cuda::require_device();
        } catch (const snug::NoCudaDevice& e) {
            message = e.what();
        }
        INFO(message);
        CHECK_THAT(message, Contains("no CUDA device"));
        CHECK_THAT(message, Contains("--device host"));
        CHECK_THAT(message, Contains("cuda_errors_test.cpp:" + line));
        // Catchable as every base the hierarchy promises.
        CHECK_THROWS_AS(snug::cuda::require_device(), snug::CudaError);
        CHECK_THROWS_AS(snug::cuda::require_device(), snug::Error);
    } else {
        CHECK(count > 0);
        CHECK_NOTHROW(snug::cuda::require_device());
    }
}

TEST_CASE("check turns a failed CUDA status into CudaError naming the call site") {
    CHECK_NOTHROW(snug::cuda::check(cudaSuccess));

    std::string message;
    const std::string line = std::to_string(__LINE__ + 2);
    try {
        snug::cuda::check(cudaErrorInvalidValue);
    } catch (const snug::CudaError& e) {
        message = e.what();
    }
    INFO(message);
    CHECK_THAT(message, Contains("cuda_errors_test.cpp:" + line + ": "));
    CHECK_THAT(message, Contains("cudaErrorInvalidValue"));
    CHECK_THAT(message, Contains("invalid argument"));  // the runtime's own description
    // Only the file name, not the build machine's directory.
    CHECK(message.find('/') == std::string::npos);

    CHECK_THROWS_WITH(snug::cuda::check(cudaErrorMemoryAllocation), Contains("cudaErrorMemoryAllocation"));
}

TEST_CASE("check reports a real failing runtime call") {
    // An invalid copy fails with or without a GPU (invalid value there, no
    // driver or no device here); either way it is a CudaError from this file.
    const cudaError_t status = cudaMemcpy(nullptr, nullptr, 16, cudaMemcpyHostToDevice);
    REQUIRE(status != cudaSuccess);
    CHECK_THROWS_WITH(snug::cuda::check(status),
                      Contains("cuda_errors_test.cpp:") && Contains(cudaGetErrorName(status)));
}

TEST_CASE("check_last_launch reports the runtime's pending error once") {
    if (raw_device_count() == 0) {
        // Without a usable driver the runtime's initialisation error is sticky:
        // every call, cudaGetLastError included, keeps returning it.
        CHECK_THROWS_AS(snug::cuda::check_last_launch(), snug::CudaError);
        CHECK_THROWS_AS(snug::cuda::check_last_launch(), snug::CudaError);
        return;
    }
    (void)cudaGetLastError();
    CHECK_NOTHROW(snug::cuda::check_last_launch());
    // A failed call leaves its error pending; check_last_launch reports and clears it.
    REQUIRE(cudaMemcpy(nullptr, nullptr, 16, cudaMemcpyHostToDevice) != cudaSuccess);
    CHECK_THROWS_WITH(snug::cuda::check_last_launch(), Contains("cudaErrorInvalidValue"));
    CHECK_NOTHROW(snug::cuda::check_last_launch());
    // check() clears the pending error of the failure it reports, so it is reported once.
    const cudaError_t status = cudaMemcpy(nullptr, nullptr, 16, cudaMemcpyHostToDevice);
    CHECK_THROWS_AS(snug::cuda::check(status), snug::CudaError);
    CHECK_NOTHROW(snug::cuda::check_last_launch());
}

TEST_CASE("check turns a failed cuBLAS status into CudaError naming the call site") {
    CHECK_NOTHROW(snug::cuda::check(CUBLAS_STATUS_SUCCESS));

    std::string message;
    const std::string line = std::to_string(__LINE__ + 2);
    try {
        snug::cuda::check(CUBLAS_STATUS_INVALID_VALUE);
    } catch (const snug::CudaError& e) {
        message = e.what();
    }
    INFO(message);
    CHECK_THAT(message, Contains("cuda_errors_test.cpp:" + line + ": "));
    CHECK_THAT(message, Contains("CUBLAS_STATUS_INVALID_VALUE"));

    CHECK_THROWS_WITH(snug::cuda::check(CUBLAS_STATUS_NOT_SUPPORTED), Contains("CUBLAS_STATUS_NOT_SUPPORTED"));
    CHECK_THROWS_AS(snug::cuda::check(CUBLAS_STATUS_EXECUTION_FAILED), snug::Error);
}

#else

TEST_CASE("cuda error handling (needs the CUDA toolkit)") { SUCCEED("skipped: built without the CUDA toolkit"); }

#endif
