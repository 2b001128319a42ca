// AccumulationPolicy: how many micro-batches make one optimizer update.
// n micro-batches of b sequences give the same update as one batch of n·b:
// each micro-batch's loss is divided by n, gradients add up in fp32, and the
// loss scale stays fixed across the micro-batches of one update.
//   None    one micro-batch per update
//   Steps   n micro-batches per update, n chosen at run time
#pragma once

#include <concepts>
#include <string>

#include "snug/core/error.hpp"

namespace snug {

template <class A>
concept AccumulationPolicy = requires(const A& a) {
    { a.steps() } -> std::convertible_to<int>;
};

namespace accumulate {

struct None {
    static constexpr const char* name = "none";
    static constexpr int steps() { return 1; }
};

class Steps {
public:
    static constexpr const char* name = "steps";
    Steps() = default;  // one micro-batch per update until set_steps (so `= {}` default arguments compile)
    explicit Steps(int n) { set_steps(n); }
    int steps() const { return n_; }
    void set_steps(int n) {
        if (n < 1) throw ConfigError("accumulate::Steps: " + std::to_string(n) + " micro-batches per update; need at least 1");
        n_ = n;
    }

private:
    int n_ = 1;
};

}  // namespace accumulate
}  // namespace snug
