// A training program's exit codes, in one place: guarded_main runs the
// program's body and turns what escapes it into 1 (a runtime error: a file,
// the numerics), 2 (the configuration, or --device cuda without a GPU) and
// 3 (over the memory budget, or out of host memory), with the reason on stderr.
#pragma once

#include <cstdio>
#include <exception>

#include "snug/core/error.hpp"

namespace snug {

//   program: the name that starts each message ("train_gpt")
//   run:     the body; returns the exit code when nothing escapes
template <class Run>
int guarded_main(const char* program, Run&& run) {
    try {
        return run();
    } catch (const OutOfMemory& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "\n%s: OutOfMemory: %s\n", program, e.what());
        return 3;
    } catch (const NoCudaDevice& e) {
        std::fprintf(stderr, "%s: %s\n", program, e.what());
        return 2;
    } catch (const ConfigError& e) {
        std::fprintf(stderr, "%s: %s\n", program, e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "\n%s: error: %s\n", program, e.what());
        return 1;
    }
}

}  // namespace snug
