// ParameterRegistry: a model declares its tensors — name, shape, how each
// starts, whether AdamW decays it — and the registry lays them out, in the
// order declared, in the one contiguous buffer a model keeps its weights in
// (and its fp32 gradients, and the optimizer its state). From the same
// declarations come what the rest of snug asks a model for: the tensors'
// offsets, their names (state files, the Hugging Face exporter), the
// optimizer's parameter groups and the initial weights.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/core/rng.hpp"
#include "snug/core/tensor.hpp"
#include "snug/optim/parameter_group.hpp"

namespace snug {

// How a tensor starts: zeros, ones, or N(0, std²) drawn for its first
// `count` elements (-1: all of them; the rest stay 0, e.g. the padded rows
// of a vocabulary).
struct Init {
    enum class Kind : std::uint8_t { zeros, ones, normal };
    Kind kind = Kind::zeros;
    float std = 0.0f;
    std::int64_t count = -1;

    static constexpr Init zeros() { return {}; }
    static constexpr Init ones() { return {Kind::ones}; }
    static constexpr Init normal(float std, std::int64_t count = -1) { return {Kind::normal, std, count}; }
};

// Whether AdamW's weight decay applies to a tensor (2-D weights, by the
// usual rule; not biases and norm parameters).
enum class Decay : bool { no = false, yes = true };

// One declared tensor and where it lives.
struct ParameterTensor {
    std::string name;     // e.g. "h.3.attn.c_attn.weight"
    Shape shape;
    std::int64_t offset;  // in elements, in the contiguous buffer
    Init init;
    Decay decay;

    std::int64_t count() const { return shape.numel(); }
};

class ParameterRegistry {
public:
    // Declares a tensor after those declared so far; returns its offset.
    // An empty name, a name declared before or a shape with no elements
    // throws ConfigError naming it.
    std::int64_t add(std::string name, Shape shape, Init init, Decay decay) {
        if (name.empty()) throw ConfigError("ParameterRegistry: a tensor needs a name");
        if (shape.rank() == 0 || shape.numel() <= 0)
            throw ConfigError("ParameterRegistry: tensor '" + name + "' has shape " + shape.str() +
                              ", which holds no elements");
        if (index_.contains(name))
            throw ConfigError("ParameterRegistry: tensor '" + name + "' is declared twice");
        if (init.kind == Init::Kind::normal && init.count > shape.numel())
            throw ConfigError("ParameterRegistry: tensor '" + name + "' draws " + std::to_string(init.count) +
                              " values but holds " + std::to_string(shape.numel()));
        // The tensor first, then its index entry, then the total: an
        // allocation that fails on the way leaves the registry as it was.
        const std::int64_t offset = total_;
        tensors_.push_back({name, std::move(shape), offset, init, decay});
        try {
            index_.emplace(std::move(name), tensors_.size() - 1);
        } catch (...) {
            tensors_.pop_back();
            throw;
        }
        total_ += tensors_.back().shape.numel();
        return offset;
    }

    // Elements of the whole buffer.
    std::int64_t total() const { return total_; }
    // Views into the registry: not of a temporary one (`for (auto& t :
    // make_registry().tensors())` would read freed memory), hence & only.
    std::span<const ParameterTensor> tensors() const& { return tensors_; }
    std::span<const ParameterTensor> tensors() const&& = delete;

    // The tensor of that name; an unknown name throws ConfigError naming it.
    const ParameterTensor& find(std::string_view name) const&& = delete;
    const ParameterTensor& find(std::string_view name) const& {
        const auto it = index_.find(std::string(name));
        if (it != index_.end()) return tensors_[it->second];
        throw ConfigError("no parameter named '" + std::string(name) + "'");
    }

    // AdamW's groups: consecutive tensors of the same decay merge.
    std::vector<ParameterGroup> groups() const {
        std::vector<ParameterGroup> out;
        for (const ParameterTensor& t : tensors_) {
            const bool decay = t.decay == Decay::yes;
            if (!out.empty() && out.back().decay == decay)
                out.back().count += t.count();
            else
                out.push_back({t.offset, t.count(), decay});
        }
        return out;
    }

    // Where the tensors whose names start with `prefix` lie (a block's:
    // "h.3."), adjacent ones merged into one range, in buffer order.
    std::vector<ParameterRange> ranges(std::string_view prefix) const {
        std::vector<ParameterRange> out;
        for (const ParameterTensor& t : tensors_) {
            if (!t.name.starts_with(prefix)) continue;
            if (!out.empty() && out.back().offset + out.back().count == t.offset)
                out.back().count += t.count();
            else
                out.push_back({t.offset, t.count()});
        }
        return out;
    }

    // The initial weights, fp32 on the host, deterministic in `seed`: one
    // Philox stream drawn tensor by tensor in declaration order.
    std::vector<float> initial_values(std::uint64_t seed) const {
        std::vector<float> w(static_cast<std::size_t>(total_), 0.0f);
        Generator rng(seed);
        for (const ParameterTensor& t : tensors_) {
            float* p = w.data() + t.offset;
            switch (t.init.kind) {
                case Init::Kind::zeros: break;
                case Init::Kind::ones:
                    for (std::int64_t j = 0; j < t.count(); ++j) p[j] = 1.0f;
                    break;
                case Init::Kind::normal: {
                    const std::int64_t n = t.init.count < 0 ? t.count() : t.init.count;
                    for (std::int64_t j = 0; j < n; ++j) p[j] = t.init.std * rng.normal();
                    break;
                }
            }
        }
        return w;
    }

private:
    std::vector<ParameterTensor> tensors_;
    std::unordered_map<std::string, std::size_t> index_;  // name -> position in tensors_
    std::int64_t total_ = 0;
};

}  // namespace snug
