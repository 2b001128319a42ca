// Loss scalers for fp16 training: DynamicLossScaler (PyTorch GradScaler's
// state machine), StaticLossScaler (a fixed scale), the LossScalerState a
// checkpoint saves, and the concept snug::LossScaler they model.
//
// How a trainer uses one: loss *= scale() before backward; at the optimizer
// step zero a found_inf scalar, unscale_and_check(dev, grads, n, inv_scale(),
// found_inf) over every gradient buffer, skip the optimizer step when
// found_inf is set, and call update(found_inf) once per step either way.
#pragma once

#include <charconv>
#include <concepts>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>

#include "snug/core/error.hpp"

namespace snug {

// What a checkpoint saves of a loss scaler: the scale, the number of clean
// (finite) steps in a row since the scale last changed or since an overflow
// (PyTorch's growth tracker; always 0 for a static scaler), the number of
// skipped (overflowed) steps and the number of update() calls in all.
struct LossScalerState {
    float scale;
    int growth_tracker;
    std::int64_t skipped;
    std::int64_t steps;
};

// ---- the concept, one requirement per member ----------------------------------
// A type that misses one member fails the concept named after that member, so
// the compiler's message says which member is missing.

// s.scale(): the factor the loss is multiplied by before backward.
template <class S>
concept LossScalerScale = requires(const S& s) {
    { s.scale() } -> std::same_as<float>;
};

// s.inv_scale(): the factor the gradients are multiplied by (1 / scale).
template <class S>
concept LossScalerInvScale = requires(const S& s) {
    { s.inv_scale() } -> std::same_as<float>;
};

// s.update(found_inf): called once per optimizer step, after the finite check.
template <class S>
concept LossScalerUpdate = requires(S& s, bool found_inf) {
    { s.update(found_inf) } -> std::same_as<void>;
};

// s.skipped_steps(): how many steps overflowed (and so were skipped).
template <class S>
concept LossScalerSkippedSteps = requires(const S& s) {
    { s.skipped_steps() } -> std::same_as<std::int64_t>;
};

// s.total_steps(): how many times update() was called.
template <class S>
concept LossScalerTotalSteps = requires(const S& s) {
    { s.total_steps() } -> std::same_as<std::int64_t>;
};

// s.state() / s.restore(state): the checkpoint round trip.
template <class S>
concept LossScalerCheckpoint = requires(S& s, const S& cs, const LossScalerState& st) {
    { cs.state() } -> std::same_as<LossScalerState>;
    s.restore(st);
};

// What an Fp16 precision policy needs of its loss scaler.
template <class S>
concept LossScaler = LossScalerScale<S> && LossScalerInvScale<S> && LossScalerUpdate<S> &&
                     LossScalerSkippedSteps<S> && LossScalerTotalSteps<S> && LossScalerCheckpoint<S>;

namespace detail {

// The shortest decimal that reads back as v ("0.5", "65536", "inf", "nan").
inline std::string float_text(float v) {
    char buf[64];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    return ec == std::errc{} ? std::string(buf, end) : std::string("?");
}

// The smallest scale either scaler holds: the smallest normal float, 2^-126.
// Its reciprocal 2^126 is still a finite float; a subnormal scale's would not
// always be, and a scale of 0 would make every later step overflow.
inline constexpr float min_loss_scale = std::numeric_limits<float>::min();

// Throws ConfigError "<who>: <knob> = <value> <must>" unless ok.
inline void require_knob(bool ok, const char* who, const char* knob, const std::string& value, const char* must) {
    if (!ok) throw ConfigError(std::string(who) + ": " + knob + " = " + value + " " + must);
}

// A valid scale: finite and at least min_loss_scale (false for NaN).
inline bool valid_scale(float s) {
    return s >= min_loss_scale && s <= std::numeric_limits<float>::max();
}

inline constexpr const char* scale_rule = "must be a finite float >= 2^-126 (the smallest normal float)";

// Checks a saved state's counters (not its scale) before a restore.
inline void check_state_counters(const char* who, const LossScalerState& st) {
    require_knob(st.steps >= 0, who, "steps", std::to_string(st.steps), "must be >= 0");
    require_knob(st.skipped >= 0 && st.skipped <= st.steps, who, "skipped", std::to_string(st.skipped),
                 ("must be in [0, steps = " + std::to_string(st.steps) + "]").c_str());
}

}  // namespace detail

// The knobs of DynamicLossScaler, PyTorch GradScaler's defaults.
struct DynamicLossScalerConfig {
    float init_scale = 65536.0f;  // 2^16; a finite float >= 2^-126
    float growth_factor = 2.0f;   // > 1, finite
    float backoff_factor = 0.5f;  // in (0, 1)
    int growth_interval = 2000;   // clean steps in a row before the scale grows; >= 1
};

// PyTorch GradScaler's dynamic loss scale. update(found_inf):
// - inf/NaN found: scale *= backoff_factor, the clean-step counter resets to
//   0, and the step counts as skipped;
// - clean: the counter goes up by one; when it reaches growth_interval, scale
//   *= growth_factor and the counter resets to 0.
// Two guards: growth that would give inf leaves the scale as it is (as
// PyTorch does; the counter still resets), and backoff that would go below
// the smallest normal float (2^-126) stops there instead (PyTorch has no such
// floor, but a scale that reached 0 would skip every step forever, and
// 1 / a subnormal scale can be inf).
class DynamicLossScaler {
public:
    using Config = DynamicLossScalerConfig;

    DynamicLossScaler() : DynamicLossScaler(Config{}) {}

    // Throws ConfigError naming the first bad knob.
    explicit DynamicLossScaler(const Config& config) : config_(config), scale_(config.init_scale) {
        constexpr const char* who = "DynamicLossScaler";
        detail::require_knob(detail::valid_scale(config.init_scale), who, "init_scale",
                             detail::float_text(config.init_scale), detail::scale_rule);
        detail::require_knob(config.growth_factor > 1.0f && config.growth_factor <= std::numeric_limits<float>::max(),
                             who, "growth_factor", detail::float_text(config.growth_factor),
                             "must be a finite float > 1");
        detail::require_knob(config.backoff_factor > 0.0f && config.backoff_factor < 1.0f, who, "backoff_factor",
                             detail::float_text(config.backoff_factor), "must be in (0, 1)");
        detail::require_knob(config.growth_interval >= 1, who, "growth_interval",
                             std::to_string(config.growth_interval), "must be >= 1");
    }

    const Config& config() const noexcept { return config_; }

    // The factor the loss is multiplied by.
    float scale() const noexcept { return scale_; }

    // 1 / scale, computed in double and rounded once (exact for a power of
    // two, which every scale reached from the defaults is); always finite.
    float inv_scale() const noexcept { return static_cast<float>(1.0 / static_cast<double>(scale_)); }

    void update(bool found_inf) noexcept {
        ++steps_;
        if (found_inf) {
            ++skipped_;
            growth_tracker_ = 0;
            const float backed_off = scale_ * config_.backoff_factor;
            scale_ = backed_off < detail::min_loss_scale ? detail::min_loss_scale : backed_off;
            return;
        }
        if (++growth_tracker_ == config_.growth_interval) {
            growth_tracker_ = 0;
            const float grown = scale_ * config_.growth_factor;
            if (grown <= std::numeric_limits<float>::max()) scale_ = grown;
        }
    }

    // Overflowed (skipped) steps since construction.
    std::int64_t skipped_steps() const noexcept { return skipped_; }
    // Clean steps since the last overflow or growth (PyTorch's growth tracker);
    // always < growth_interval.
    int clean_steps_in_a_row() const noexcept { return growth_tracker_; }
    // update() calls since construction.
    std::int64_t total_steps() const noexcept { return steps_; }

    LossScalerState state() const noexcept { return {scale_, growth_tracker_, skipped_, steps_}; }

    // Continues from a saved state (the knobs stay this scaler's own). Throws
    // ConfigError naming the bad field (scale not a valid scale, growth_tracker
    // outside [0, growth_interval), counters negative or skipped > steps) and
    // changes nothing then.
    void restore(const LossScalerState& st) {
        constexpr const char* who = "DynamicLossScaler::restore";
        detail::require_knob(detail::valid_scale(st.scale), who, "scale", detail::float_text(st.scale),
                             detail::scale_rule);
        detail::require_knob(st.growth_tracker >= 0 && st.growth_tracker < config_.growth_interval, who,
                             "growth_tracker", std::to_string(st.growth_tracker),
                             ("must be in [0, growth_interval = " + std::to_string(config_.growth_interval) + ")")
                                 .c_str());
        detail::check_state_counters(who, st);
        scale_ = st.scale;
        growth_tracker_ = st.growth_tracker;
        skipped_ = st.skipped;
        steps_ = st.steps;
    }

private:
    Config config_;
    float scale_;
    int growth_tracker_ = 0;
    std::int64_t skipped_ = 0;
    std::int64_t steps_ = 0;
};

// A fixed loss scale. The default, 65536 = 2^16, is DynamicLossScaler's
// initial scale, so switching between the two starts from the same place.
// update(found_inf) only counts: an overflowed step is still skipped (the
// caller does that), but the scale never changes.
class StaticLossScaler {
public:
    StaticLossScaler() : StaticLossScaler(65536.0f) {}

    // Throws ConfigError naming "scale" unless it is a finite float >= 2^-126.
    explicit StaticLossScaler(float scale) : scale_(scale) {
        detail::require_knob(detail::valid_scale(scale), "StaticLossScaler", "scale", detail::float_text(scale),
                             detail::scale_rule);
    }

    float scale() const noexcept { return scale_; }
    // 1 / scale, computed in double and rounded once; always finite.
    float inv_scale() const noexcept { return static_cast<float>(1.0 / static_cast<double>(scale_)); }

    void update(bool found_inf) noexcept {
        ++steps_;
        if (found_inf) ++skipped_;
    }

    std::int64_t skipped_steps() const noexcept { return skipped_; }
    std::int64_t total_steps() const noexcept { return steps_; }

    // growth_tracker is always 0: a static scaler never grows.
    LossScalerState state() const noexcept { return {scale_, 0, skipped_, steps_}; }

    // Continues the counters of a saved state. Throws ConfigError naming the
    // bad field, and changes nothing, when the saved scale is not this
    // scaler's (the checkpoint came from another configuration), growth_tracker
    // is not 0, or the counters are negative or skipped > steps.
    void restore(const LossScalerState& st) {
        constexpr const char* who = "StaticLossScaler::restore";
        detail::require_knob(st.scale == scale_, who, "scale", detail::float_text(st.scale),
                             ("must equal this scaler's fixed scale " + detail::float_text(scale_)).c_str());
        detail::require_knob(st.growth_tracker == 0, who, "growth_tracker", std::to_string(st.growth_tracker),
                             "must be 0 (a static scaler never grows)");
        detail::check_state_counters(who, st);
        skipped_ = st.skipped;
        steps_ = st.steps;
    }

private:
    float scale_;
    std::int64_t skipped_ = 0;
    std::int64_t steps_ = 0;
};

static_assert(LossScaler<DynamicLossScaler>);
static_assert(LossScaler<StaticLossScaler>);

}  // namespace snug
