// check_gradients<Family>(shape): a finite-difference check of a family's
// block (yours, say), in double on the host. It builds one block of `shape`,
// draws its weights from the registry's initialisation plus noise (norm
// weights start at one; the noise makes them count), and compares its
// backward — the input's gradient and each parameter tensor's — with
// five-point central differences of the loss sum(forward(x) * G) for random x
// and G, each element's error relative to the largest gradient of its tensor.
// It also
// checks the block's arena contract: backward gives back everything forward
// kept. snug's own blocks are held to the same check in tests/host.
//
//   const snug::GradientCheck g = snug::check_gradients<MyFamily>(shape);
//   if (!g.passes(1e-4)) std::puts(g.summary().c_str());
//
// It costs four forwards per input element and per parameter: use a small
// shape (C 8, a few heads, B 2, T 5). The block must compile with Act =
// double on snug::Host (its host kernels templated on the element type).
// A block computed in double throughout checks to about 1e-9; one that
// computes in fp32 inside (as a kernel shared with the GPU usually does)
// rounds its forward to about 1e-7, which the differences divide by h:
// expect 1e-4 there (examples/custom_layer's block: 2e-4).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "snug/core/arena.hpp"
#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/core/tensor.hpp"
#include "snug/nn/context.hpp"
#include "snug/nn/family.hpp"
#include "snug/nn/parameters.hpp"

namespace snug {

struct GradientCheckOptions {
    int batch = 2;             // B
    int seq = 5;               // T
    std::uint64_t seed = 1;    // the weights, their noise, x and G
    double step = 1e-2;        // the differences' h (five-point: accurate to ~1e-9 at 1e-2 for a smooth block)
    double weight_noise = 0.2; // uniform in [-noise, noise], added to every initial weight
    double floor = 1e-6;       // error = |got - want| / max(floor, the tensor's largest |want|)
};

// One compared gradient: its largest relative error and where it is.
struct GradientError {
    std::string name;    // "input" or the tensor's registry name
    double error = 0.0;  // max over elements of |got - want| / max(floor, max |want|); inf for a NaN
    std::int64_t at = 0; // the element with that error
    double got = 0.0, want = 0.0;
};

struct GradientCheck {
    GradientError input;                // d loss / d x
    std::vector<GradientError> tensors; // one per parameter tensor, in the registry's order
    bool released = false;              // backward gave back everything forward kept on the arenas

    // The largest error of all.
    const GradientError& worst() const {
        const GradientError* w = &input;
        for (const GradientError& t : tensors)
            if (t.error > w->error) w = &t;
        return *w;
    }
    // Every gradient within `tolerance` and the arenas given back.
    bool passes(double tolerance) const { return released && worst().error <= tolerance; }

    // One line per gradient: its error and its worst element.
    std::string summary() const {
        std::string s = released ? "" : "backward left activations on the arenas (it must pop what forward pushed)\n";
        auto line = [&](const GradientError& e) {
            char buf[256];
            std::snprintf(buf, sizeof buf, "%-48s max relative error %.3g (element %lld: %.9g, differences %.9g)\n",
                          e.name.c_str(), e.error, static_cast<long long>(e.at), e.got, e.want);
            s += buf;
        };
        line(input);
        for (const GradientError& t : tensors) line(t);
        return s;
    }
};

namespace detail {

// Each element's error relative to the largest of the tensor's gradient (at
// least `floor`): an element whose gradient is tiny beside its neighbours is
// not held to digits the differences cannot give it.
template <class G>
GradientError gradient_error(std::string name, const G* got, const double* want, std::int64_t n, double floor) {
    double scale = floor;
    for (std::int64_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(want[i]));
    GradientError e{std::move(name)};
    for (std::int64_t i = 0; i < n; ++i) {
        const double g = static_cast<double>(got[i]);
        double r = std::fabs(g - want[i]) / scale;
        if (std::isnan(r)) r = std::numeric_limits<double>::infinity();
        if (i == 0 || r > e.error) e = {e.name, r, i, g, want[i]};
    }
    return e;
}

}  // namespace detail

template <class Family>
GradientCheck check_gradients(const typename Family::BlockShape& shape, const GradientCheckOptions& o = {}) {
    static_assert(check_family<Family, double, Host>());
    using Block = typename Family::template Block<double, Host>;
    const int C = Family::channels(shape);
    if (o.batch < 1 || o.seq < 1 || C < 1)
        throw ConfigError("check_gradients: B " + std::to_string(o.batch) + ", T " + std::to_string(o.seq) +
                          " and channels " + std::to_string(C) + " must be positive");
    if (!(o.step > 0.0) || !(o.floor > 0.0) || !(o.weight_noise >= 0.0))
        throw ConfigError("check_gradients: step and floor must be positive and weight_noise not negative");

    ParameterRegistry registry;
    Block block(registry, "layers.0.", shape);
    std::mt19937_64 gen(o.seed);
    auto uniform = [&](double lo, double hi) {
        std::uniform_real_distribution<double> d(lo, hi);
        return d(gen);
    };
    const std::vector<float> init = registry.initial_values(o.seed);
    std::vector<double> params(init.size());
    for (std::size_t i = 0; i < init.size(); ++i) params[i] = init[i] + uniform(-o.weight_noise, o.weight_noise);
    std::vector<float> grads(init.size(), 0.0f);
    block.bind({params.data(), grads.data()});

    const Shape s{o.batch, o.seq, C};
    const auto n = static_cast<std::size_t>(s.numel());
    std::vector<double> x(n), G(n);
    for (double& v : x) v = uniform(-1.5, 1.5);
    for (double& v : G) v = uniform(-1.0, 1.0);

    MemoryTracker tracker;
    ActivationArena<Host> activations(tracker);
    ActivationArena<Host> scratch(tracker, ActivationArena<Host>::default_chunk_bytes, MemoryCategory::temporaries);
    Context<Host> ctx{Host{}, activations, scratch};

    // The loss sum(out * G), leaving the arenas empty.
    std::vector<double> out(n);
    auto loss = [&] {
        block.forward(ctx, TensorView<const double, Host>(x.data(), s), TensorView<double, Host>(out.data(), s));
        activations.clear();
        scratch.clear();
        double l = 0.0;
        for (std::size_t i = 0; i < n; ++i) l += out[i] * G[i];
        return l;
    };
    // Five-point central differences: truncation error O(h^4), so a step
    // large enough to rise above a block's fp32 rounding is still accurate.
    auto differences = [&](std::vector<double>& v) {
        std::vector<double> d(v.size());
        const double h = o.step;
        auto at = [&](std::size_t i, double value) {
            v[i] = value;
            return loss();
        };
        for (std::size_t i = 0; i < v.size(); ++i) {
            const double keep = v[i];
            const double f2 = at(i, keep + 2 * h), f1 = at(i, keep + h);
            const double m1 = at(i, keep - h), m2 = at(i, keep - 2 * h);
            v[i] = keep;
            d[i] = (8 * (f1 - m1) - (f2 - m2)) / (12 * h);
        }
        return d;
    };

    // The block's own backward, once, from a fresh forward.
    GradientCheck check;
    std::vector<double> dx(n, std::numeric_limits<double>::quiet_NaN());  // backward overwrites din
    block.forward(ctx, TensorView<const double, Host>(x.data(), s), TensorView<double, Host>(out.data(), s));
    block.backward(ctx, TensorView<const double, Host>(x.data(), s), TensorView<const double, Host>(G.data(), s),
                   TensorView<double, Host>(dx.data(), s));
    check.released = activations.live_bytes() == 0 && scratch.live_bytes() == 0;
    activations.clear();
    scratch.clear();
    const std::vector<float> got = grads;

    const std::vector<double> dx_want = differences(x);
    check.input = detail::gradient_error("input", dx.data(), dx_want.data(), static_cast<std::int64_t>(n), o.floor);
    const std::vector<double> dp_want = differences(params);
    for (const ParameterTensor& t : registry.tensors())
        check.tensors.push_back(
            detail::gradient_error(t.name, got.data() + t.offset, dp_want.data() + t.offset, t.count(), o.floor));
    return check;
}

}  // namespace snug
