// LrSchedule: the learning rate of each update — a linear warmup followed by
// a cosine decay to a floor, the schedule of GPT-2-style training (llm.c,
// nanoGPT):
//
//   step s (0-based), W warmup steps, S total steps, peak lr, floor f·lr:
//   s < W            lr · (s + 1) / W                       (a line from 0 at s = -1)
//   W <= s < S       f·lr + (lr - f·lr) · ½ (1 + cos(π (s - W) / (S - W)))
//   s >= S           f·lr
#pragma once

#include <cmath>
#include <numbers>
#include <string>

#include "snug/core/error.hpp"

namespace snug {

struct LrSchedule {
    float max_lr = 3e-4f;         // the peak, reached at the end of warmup
    int warmup_steps = 0;         // W >= 0; 0: the first update already uses max_lr
    int total_steps = 1;          // S >= 1: the decay reaches the floor here
    float min_lr_fraction = 0.0f; // f in [0, 1]: the floor as a fraction of max_lr

    // Throws ConfigError naming the first value that makes no sense.
    void validate() const {
        if (!(std::isfinite(max_lr) && max_lr > 0.0f))
            throw ConfigError("learning rate must be positive and finite, got " + std::to_string(max_lr));
        if (warmup_steps < 0)
            throw ConfigError("warmup steps must be >= 0, got " + std::to_string(warmup_steps));
        if (total_steps < 1) throw ConfigError("total steps must be >= 1, got " + std::to_string(total_steps));
        if (!(min_lr_fraction >= 0.0f && min_lr_fraction <= 1.0f))
            throw ConfigError("minimum learning-rate fraction must lie in [0, 1], got " +
                              std::to_string(min_lr_fraction));
    }

    // The learning rate of update `step` (0-based).
    float operator()(int step) const {
        const double peak = max_lr;
        const double floor = peak * min_lr_fraction;
        if (step < warmup_steps) return static_cast<float>(peak * (step + 1) / warmup_steps);
        if (step >= total_steps) return static_cast<float>(floor);
        const double progress = static_cast<double>(step - warmup_steps) / (total_steps - warmup_steps);
        const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
        return static_cast<float>(floor + (peak - floor) * cosine);
    }
};

}  // namespace snug
