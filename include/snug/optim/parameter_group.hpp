// ParameterGroup: a range of a model's contiguous parameter buffer and
// whether weight decay applies to it — what a model tells its optimizer. It
// stands below the models (nn/) and the optimizers (optim/adamw.hpp).
#pragma once

#include <cstdint>

namespace snug {

struct ParameterGroup {
    std::int64_t offset;
    std::int64_t count;
    bool decay;
};

}  // namespace snug
