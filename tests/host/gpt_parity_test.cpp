// PyTorch parity: tests/parity/make_gpt_reference.py builds a small GPT-2 with
// PyTorch (independently of snug), runs one forward/backward in float64 and
// stores parameters, tokens, logits, loss and every gradient. snug's fp32 GPT
// on the host must reproduce all of it to 1e-4 relative error per tensor.
#include <catch2/catch.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "snug/io/safetensors.hpp"
#include "snug/nn/gpt.hpp"
#include "support/host_run.hpp"

namespace {

const std::string reference_path = std::string(SNUG_TEST_DATA_DIR) + "/gpt_reference.safetensors";

// Normwise relative error max|a - b| / max|b|, and the max absolute error.
struct Error {
    double max_abs = 0, max_ref = 0;
    double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
};

template <class A>
Error compare(const A* ours, const std::vector<double>& ref) {
    Error e;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        e.max_abs = std::max(e.max_abs, std::abs(static_cast<double>(ours[i]) - ref[i]));
        e.max_ref = std::max(e.max_ref, std::abs(ref[i]));
    }
    return e;
}

struct Reference {
    snug::io::SafetensorsFile file{reference_path};
    snug::GPTConfig config;
    int B, T;

    Reference() {
        auto meta = [&](const char* k) { return std::stoi(file.meta(k)); };
        config.vocab_size = meta("vocab_size");
        config.padded_vocab_size = meta("padded_vocab_size");
        config.max_seq_len = meta("max_seq_len");
        config.n_layer = meta("n_layer");
        config.n_head = meta("n_head");
        config.channels = meta("channels");
        B = meta("B");
        T = meta("T");
    }

    // The reference parameters laid out in snug's contiguous buffer.
    std::vector<float> weights() const {
        std::vector<float> w(static_cast<std::size_t>(snug::GPTLayout(config).total()), -1e30f);
        for (const snug::ParameterTensor& t : snug::gpt_named_tensors(config)) {
            const auto values = file.values<float>("param." + t.name);
            REQUIRE(static_cast<std::int64_t>(values.size()) == t.shape.numel());
            std::copy(values.begin(), values.end(), w.begin() + t.offset);
        }
        return w;
    }
};

}  // namespace

TEST_CASE("the named tensors tile the parameter buffer exactly") {
    const Reference ref;
    std::vector<int> covered(static_cast<std::size_t>(snug::GPTLayout(ref.config).total()), 0);
    for (const snug::ParameterTensor& t : snug::gpt_named_tensors(ref.config))
        for (std::int64_t i = 0; i < t.shape.numel(); ++i) ++covered[static_cast<std::size_t>(t.offset + i)];
    CHECK(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }));
    // Every reference parameter has a snug name, and the other way round.
    std::size_t params_in_file = 0;
    for (const auto& [name, t] : ref.file.tensors()) params_in_file += name.rfind("param.", 0) == 0;
    CHECK(params_in_file == snug::gpt_named_tensors(ref.config).size());
}

TEST_CASE("fp32 GPT on the host matches PyTorch: logits, loss and every gradient") {
    const Reference ref;
    snug::test::HostRun run;
    snug::GPT<float, snug::Host> model(ref.config, run.tracker);
    model.load_weights(run.ctx.device, ref.weights());
    const auto tokens = ref.file.values<std::int32_t>("tokens");
    const auto targets = ref.file.values<std::int32_t>("targets");
    const int B = ref.B, T = ref.T, V = ref.config.vocab_size, Vp = ref.config.padded_vocab_size;
    const double tol = 1e-4;

    // A pass without targets keeps the whole logits readable (one with
    // targets computes them a chunk at a time and keeps none).
    model.forward(run.ctx, tokens.data(), nullptr, B, T, 0.0f);
    {
        const auto want = ref.file.values<double>("logits");  // (B, T, V)
        std::vector<float> got(want.size());
        const float* logits = model.logits().data();  // (B, T, Vp)
        for (int r = 0; r < B * T; ++r)
            for (int v = 0; v < V; ++v)
                got[static_cast<std::size_t>(r * V + v)] = logits[static_cast<std::ptrdiff_t>(r) * Vp + v];
        const Error e = compare(got.data(), want);
        fmt::print("parity {:<32} max abs {:.3e}  rel {:.3e}\n", "logits", e.max_abs, e.rel());
        CHECK(e.rel() < tol);
    }
    model.release(run.ctx);
    const float eval_loss = model.evaluate(run.ctx, tokens.data(), targets.data(), B, T);
    const double want_loss = ref.file.values<double>("loss")[0];
    fmt::print("parity {:<32} ours {:.9f}  torch {:.9f}\n", "loss", eval_loss, want_loss);
    CHECK(std::abs(eval_loss - want_loss) / want_loss < tol);

    // Training pass: loss = mean over B*T tokens, so dloss = 1 / (B T).
    model.zero_grad(run.ctx.device);
    const float loss = model.forward(run.ctx, tokens.data(), targets.data(), B, T, 1.0f / static_cast<float>(B * T));
    CHECK(loss == eval_loss);
    model.backward(run.ctx, tokens.data());
    CHECK(run.tracker.current(snug::MemoryCategory::activations) == 0);
    CHECK(run.tracker.current(snug::MemoryCategory::temporaries) == 0);

    for (const snug::ParameterTensor& t : snug::gpt_named_tensors(ref.config)) {
        auto want = ref.file.values<double>("grad." + t.name);
        const float* got = model.gradients() + t.offset;
        const Error e = compare(got, want);
        fmt::print("parity grad {:<27} max abs {:.3e}  rel {:.3e}\n", t.name, e.max_abs, e.rel());
        INFO("gradient of " << t.name << ": max abs error " << e.max_abs << ", relative " << e.rel());
        CHECK(e.rel() < tol);
    }
    // The padded vocabulary rows of wte get exactly zero gradient.
    const float* dwte = model.gradient_tensors()[snug::GPTTensor::wte];
    const std::int64_t C = ref.config.channels;
    CHECK(std::all_of(dwte + V * C, dwte + Vp * C, [](float g) { return g == 0.0f; }));
}
