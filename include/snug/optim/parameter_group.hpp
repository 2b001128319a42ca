// ParameterGroup: a range of a model's contiguous parameter buffer and
// whether weight decay applies to it — what a model tells its optimizer.
// ParameterRange: just a range of it (a block's tensors, whose gradients
// TrainStep sums over the ranks as soon as they are final). Both stand below
// the models (nn/), the optimizers (optim/adamw.hpp) and dist/.
#pragma once

#include <cstdint>

namespace snug {

struct ParameterGroup {
    std::int64_t offset;
    std::int64_t count;
    bool decay;
};

struct ParameterRange {
    std::int64_t offset;  // in elements
    std::int64_t count;
    friend bool operator==(const ParameterRange&, const ParameterRange&) = default;
};

}  // namespace snug
