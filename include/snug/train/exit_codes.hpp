// A training program's exit codes, in one place: guarded_main runs the
// program's body and turns what escapes it into 1 (a runtime error: a file,
// the numerics), 2 (the configuration, or --device cuda without a GPU) and
// 3 (over the memory budget, or out of host memory), with the reason on stderr.
#pragma once

#include <cstdio>
#include <exception>
#include <utility>

#include "snug/core/error.hpp"

namespace snug {

//   program:  the name that starts each message ("train_gpt")
//   run:      the body; returns the exit code when nothing escapes
//   on_error: called with the exit code after an escaped error is printed
//             (a data-parallel job ends its other ranks there: dist::Ranks::abort)
template <class Run, class OnError>
int guarded_main(const char* program, Run&& run, OnError&& on_error) {
    int code = 0;
    try {
        return run();
    } catch (const OutOfMemory& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "\n%s: OutOfMemory: %s\n", program, e.what());
        code = 3;
    } catch (const NoCudaDevice& e) {
        std::fprintf(stderr, "%s: %s\n", program, e.what());
        code = 2;
    } catch (const ConfigError& e) {
        std::fprintf(stderr, "%s: %s\n", program, e.what());
        code = 2;
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "\n%s: error: %s\n", program, e.what());
        code = 1;
    }
    std::fflush(stderr);
    on_error(code);
    return code;
}

template <class Run>
int guarded_main(const char* program, Run&& run) {
    return guarded_main(program, std::forward<Run>(run), [](int) {});
}

}  // namespace snug
