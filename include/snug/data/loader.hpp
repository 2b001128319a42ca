// Batches from a token stream: consecutive windows of B*T+1 tokens, read as
// inputs (B, T) and targets shifted by one, wrapping to the start at the end;
// and the split of one stream into training and validation parts.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "snug/core/error.hpp"

namespace snug::data {

class BatchLoader {
public:
    // `what` names the stream in messages ("val data"). A stream shorter than
    // one batch (B*T+1 tokens) throws snug::Error naming both sizes.
    BatchLoader(std::vector<std::int32_t> tokens, int B, int T, std::string what)
        : tokens_(std::move(tokens)), B_(B), T_(T), what_(std::move(what)) {
        if (B < 1 || T < 1)
            throw ConfigError(what_ + ": batch size " + std::to_string(B) + " and sequence length " +
                              std::to_string(T) + " must both be positive");
        if (size() < window())
            throw Error(what_ + ": " + std::to_string(size()) + " tokens is shorter than one batch of B*T+1 = " +
                        std::to_string(window()) + " (B = " + std::to_string(B) + ", T = " + std::to_string(T) +
                        ")");
    }

    // Fills tokens (B, T) and targets (B, T) in host memory from the window at
    // position(), then advances by B*T. A window that would run past the end
    // starts at 0 instead.
    void next(std::int32_t* tokens /* (B, T) */, std::int32_t* targets /* (B, T) */) {
        if (position_ + window() > size()) position_ = 0;
        const std::int32_t* src = tokens_.data() + position_;
        const std::int64_t n = window() - 1;
        std::copy(src, src + n, tokens);
        std::copy(src + 1, src + 1 + n, targets);
        position_ += n;
        if (position_ + window() > size()) position_ = 0;
    }

    // Index of the first token of the next batch (saved in checkpoints).
    std::int64_t position() const { return position_; }
    void set_position(std::int64_t p) {
        if (p < 0 || p >= size())
            throw Error(what_ + ": position " + std::to_string(p) + " is outside the stream of " +
                        std::to_string(size()) + " tokens");
        position_ = p;
    }
    // Distinct batches before the stream wraps: floor((N - 1) / (B*T)).
    std::int64_t batches_per_epoch() const { return (size() - 1) / (window() - 1); }

    int B() const { return B_; }
    int T() const { return T_; }
    std::int64_t size() const { return static_cast<std::int64_t>(tokens_.size()); }
    const std::vector<std::int32_t>& tokens() const { return tokens_; }
    const std::string& what() const { return what_; }

private:
    std::int64_t window() const { return static_cast<std::int64_t>(B_) * T_ + 1; }

    std::vector<std::int32_t> tokens_;
    int B_, T_;
    std::string what_;
    std::int64_t position_ = 0;
};

struct TrainValSplit {
    std::vector<std::int32_t> train;
    std::vector<std::int32_t> val;
};

// The first (1 - val_fraction) of the stream for training, the rest for
// validation (rounded to the nearest token). val_fraction must lie in (0, 1);
// both parts must be non-empty. `source` names the tokens in the error.
inline TrainValSplit split_train_val(std::span<const std::int32_t> tokens, double val_fraction,
                                     std::string_view source = "the data") {
    if (!(val_fraction > 0.0 && val_fraction < 1.0))
        throw ConfigError("validation fraction " + std::to_string(val_fraction) + " is outside (0, 1)");
    const auto n = static_cast<std::int64_t>(tokens.size());
    const auto n_val = static_cast<std::int64_t>(static_cast<double>(n) * val_fraction + 0.5);
    if (n_val < 1 || n_val >= n)
        throw Error(std::string(source) + ": cannot split its " + std::to_string(n) +
                    " tokens into training and validation data with validation fraction " +
                    std::to_string(val_fraction) + ": one part would be empty");
    TrainValSplit out;
    out.train.assign(tokens.begin(), tokens.end() - n_val);
    out.val.assign(tokens.end() - n_val, tokens.end());
    return out;
}

}  // namespace snug::data
