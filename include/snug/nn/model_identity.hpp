// ModelIdentity: what a training-state file records of a model that is not
// a GPT (a CausalLM of any family), so that resuming into another model is
// refused by name rather than loaded because the parameter counts agree: the
// family's name, its config's fields (numbers: the ones that change what the
// model computes) and the registry's tensors (names and shapes, in buffer
// order). first_difference says where two identities part.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace snug {

// One config field, as a number (an int or a double; both round-trip exactly).
struct ModelField {
    std::string name;
    double value = 0.0;
};

struct ModelTensor {
    std::string name;
    std::vector<std::int64_t> shape;
};

struct ModelIdentity {
    std::string family;              // the family's name; empty where it names none
    std::vector<ModelField> config;  // the CausalLM's sizes, then the family's block fields
    std::vector<ModelTensor> tensors;
};

namespace detail::model_identity {

inline std::string number_text(double v) {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back as v
    return std::string(buf, r.ptr);
}

inline std::string shape_text(const std::vector<std::int64_t>& s) {
    std::string out = "(";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + ")";
}

}  // namespace detail::model_identity

// The first place where `saved` (a file's) and `model` (the model being
// resumed into) differ, as "what: the file has X, this model has Y"; empty
// when they are the same model. Fields are compared by name in the model's
// order (a field only one side has is a difference), tensors in order.
inline std::string first_difference(const ModelIdentity& saved, const ModelIdentity& model) {
    using detail::model_identity::number_text;
    using detail::model_identity::shape_text;
    auto differ = [](const std::string& what, const std::string& in_file, const std::string& in_model) {
        return what + ": the file has " + in_file + ", this model has " + in_model;
    };
    auto quoted = [](const std::string& s) { return "'" + s + "'"; };
    if (saved.family != model.family) return differ("the model's family", quoted(saved.family), quoted(model.family));
    for (const ModelField& f : model.config) {
        const ModelField* s = nullptr;
        for (const ModelField& g : saved.config)
            if (g.name == f.name) s = &g;
        if (!s) return differ("the config field '" + f.name + "'", "none", number_text(f.value));
        if (s->value != f.value)
            return differ("the config field '" + f.name + "'", number_text(s->value), number_text(f.value));
    }
    for (const ModelField& g : saved.config) {
        bool known = false;
        for (const ModelField& f : model.config) known = known || f.name == g.name;
        if (!known) return differ("the config field '" + g.name + "'", number_text(g.value), "none");
    }
    const std::size_t n = std::min(saved.tensors.size(), model.tensors.size());
    for (std::size_t i = 0; i < n; ++i) {
        const ModelTensor& s = saved.tensors[i];
        const ModelTensor& m = model.tensors[i];
        if (s.name != m.name)
            return differ("tensor " + std::to_string(i) + "'s name", quoted(s.name), quoted(m.name));
        if (s.shape != m.shape) return differ("the shape of '" + m.name + "'", shape_text(s.shape), shape_text(m.shape));
    }
    if (saved.tensors.size() != model.tensors.size())
        return differ("the number of tensors", std::to_string(saved.tensors.size()),
                      std::to_string(model.tensors.size()));
    return {};
}

}  // namespace snug
