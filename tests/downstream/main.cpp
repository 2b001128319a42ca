// A downstream program: includes the umbrella header, links snug::snug, and
// checks a few results so that a broken package shows up as a failure, not
// just as a link error. Exit code 0 means every check held.
#include <snug/snug.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
    int failures = 0;
    auto expect = [&](bool ok, const char* what) {
        if (!ok) {
            std::printf("FAILED: %s\n", what);
            ++failures;
        }
    };

    // The tracker enforces a budget and names the problem.
    snug::MemoryTracker tracker(snug::parse_bytes("1MiB"));
    snug::Buffer<float, snug::Host> a(tracker, snug::MemoryCategory::parameters, 1000, "a");
    expect(tracker.current_total() == 4000, "tracker counts a buffer's bytes exactly");
    bool threw = false;
    try {
        snug::Buffer<float, snug::Host> big(tracker, snug::MemoryCategory::activations, 1 << 20, "big");
    } catch (const snug::OutOfMemory&) {
        threw = true;
    }
    expect(threw, "an allocation over the budget throws OutOfMemory");

    // 16-bit types round to nearest even.
    expect(static_cast<float>(snug::half(1.0f + 1.0f / 4096)) == 1.0f, "half rounds a tie to even");

    // The host GEMM (OpenBLAS when snug was built with it): 2x2 times 2x2.
    const float A[4] = {1, 2, 3, 4}, B[4] = {5, 6, 7, 8};
    float C[4] = {};
    snug::host::gemm(snug::host::Op::N, snug::host::Op::N, 2, 2, 2, 1.0f, A, 2, B, 2, 0.0f, C, 2);
    expect(C[0] == 19 && C[1] == 22 && C[2] == 43 && C[3] == 50, "gemm computes a 2x2 product");

    std::printf("downstream: %s\n", failures == 0 ? "ok" : "FAILED");
    return failures == 0 ? 0 : 1;
}
