// The C++ half of the Hugging Face export check: builds a small GPT-2 from
// gpt_initial_weights (seeded, then scaled and with non-trivial biases and
// LayerNorms so that every tensor matters), runs snug's fp32 forward on the
// host over seeded random tokens, and writes two exports for
// tests/parity/check_hf_export.py:
//   OUT/fp32/  model.safetensors (F32), config.json, reference.safetensors
//   OUT/bf16/  model.safetensors (BF16), config.json, reference.safetensors
// and the same for a small Llama (io/hf_llama.hpp) in OUT/llama_fp32/ and
// OUT/llama_bf16/, for tests/parity/check_hf_llama.py;
// where reference.safetensors holds the tokens (B, T) and snug's logits
// (B, T, V) for the weights as exported (for bf16: the bf16-rounded weights).
//
//   export_reference OUT
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/core/half.hpp"
#include "snug/core/rng.hpp"
#include "snug/io/hf_export.hpp"
#include "snug/io/hf_llama.hpp"
#include "snug/io/safetensors.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/nn/llama.hpp"
#include "snug/nn/model_of.hpp"
#include "support/host_run.hpp"

namespace {

// Odd sizes on purpose: V not a multiple of 8 and padded, head size 12.
snug::GPTConfig reference_config() {
    snug::GPTConfig c;
    c.vocab_size = 97;
    c.padded_vocab_size = 128;
    c.max_seq_len = 16;
    c.n_layer = 2;
    c.n_head = 4;
    c.channels = 48;
    return c;
}
constexpr int B = 3, T = 11;
constexpr std::uint64_t seed = 1234;

std::vector<float> reference_weights(const snug::GPTConfig& c) {
    std::vector<float> w = snug::gpt_initial_weights(c, seed);
    snug::Generator rng(seed + 1);
    const snug::ParameterRegistry registry = snug::gpt_parameter_registry(c);
    for (const snug::ParameterTensor& t : registry.tensors()) {
        float* p = w.data() + t.offset;
        const std::int64_t n = t.count();
        if (t.decay == snug::Decay::yes) {
            for (std::int64_t j = 0; j < n; ++j) p[j] *= 10.0f;  // std 0.2: attention far from uniform
        } else {
            for (std::int64_t j = 0; j < n; ++j) p[j] += 0.1f * rng.normal();  // LayerNorms near 1, biases near 0
        }
    }
    return w;
}

// snug's logits (B, T, V) of the model `c` builds (GPT, Llama) for these
// weights, the padded columns dropped.
template <class Config>
std::vector<float> snug_logits(const Config& c, const std::vector<float>& w, const std::vector<std::int32_t>& tokens) {
    snug::test::HostRun run;
    snug::model_of<Config, float, snug::Host> model(c, run.tracker);
    model.load_weights(run.ctx.device, w);
    model.forward(run.ctx, tokens.data(), nullptr, B, T, 0.0f);
    const float* l = model.logits().data();  // (B, T, Vp)
    std::vector<float> out(static_cast<std::size_t>(B * T * c.vocab_size));
    for (int r = 0; r < B * T; ++r)
        for (int v = 0; v < c.vocab_size; ++v)
            out[static_cast<std::size_t>(r * c.vocab_size + v)] = l[static_cast<std::ptrdiff_t>(r) * c.padded_vocab_size + v];
    model.release(run.ctx);
    return out;
}

// ---- the Llama ----
// V 97 padded to 128, 2 layers of C 48 with 4 heads of 12 sharing 2
// key/value heads (grouped-query attention), MLP 128, eps and theta other
// than the defaults (so that a reader that ignores them fails).
snug::LlamaConfig llama_config() {
    snug::LlamaConfig c = snug::make_llama_config(97, 16, 2, 48, 4, 128, 2);
    c.block.norm_eps = 1e-6;
    c.block.rope_theta = 500000.0;
    return c;
}

// Each tensor's own initialisation, the projections scaled (attention far
// from uniform) and the norms moved off 1.
std::vector<float> llama_weights(const snug::LlamaConfig& c) {
    snug::MemoryTracker tracker;
    const snug::Llama<float, snug::Meter> shape(c, tracker);
    std::vector<float> w = shape.initial_weights(seed);
    snug::Generator rng(seed + 3);
    for (const snug::ParameterTensor& t : shape.registry().tensors()) {
        float* p = w.data() + t.offset;
        for (std::int64_t j = 0; j < t.count(); ++j)
            p[j] = t.decay == snug::Decay::yes ? p[j] * 5.0f : p[j] + 0.1f * rng.normal();
    }
    return w;
}

template <class T>
snug::io::SafeTensor tensor(snug::DType dtype, std::vector<std::int64_t> shape, const std::vector<T>& v) {
    snug::io::SafeTensor t{dtype, std::move(shape), std::vector<unsigned char>(v.size() * sizeof(T))};
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    return t;
}

template <class Config>
void write_case(const std::filesystem::path& dir, const Config& c, const std::vector<float>& w,
                snug::DType dtype, const std::vector<std::int32_t>& tokens) {
    if constexpr (std::is_same_v<Config, snug::LlamaConfig>)
        snug::io::export_hf_llama(dir, c, w, dtype);
    else
        snug::io::export_hf_gpt2(dir, c, w, dtype);
    // The weights as exported, to run snug on exactly what PyTorch will load.
    std::vector<float> stored = w;
    if (dtype == snug::DType::bf16)
        for (float& x : stored) x = static_cast<float>(snug::bfloat16(x));
    const std::vector<float> logits = snug_logits(c, stored, tokens);
    std::map<std::string, snug::io::SafeTensor> ref;
    ref.emplace("tokens", tensor(snug::DType::i32, {B, T}, tokens));
    ref.emplace("logits", tensor(snug::DType::f32, {B, T, c.vocab_size}, logits));
    snug::io::write_safetensors(dir / "reference.safetensors", ref,
                                {{"B", std::to_string(B)}, {"T", std::to_string(T)}, {"seed", std::to_string(seed)}});
    std::printf("wrote %s (%s weights; logits of snug's fp32 forward on the host)\n", dir.c_str(),
                dtype == snug::DType::bf16 ? "bf16" : "fp32");
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    try {
        const std::filesystem::path out = argv[1];
        const snug::GPTConfig c = reference_config();
        const std::vector<float> w = reference_weights(c);
        snug::Generator rng(seed + 2);
        std::vector<std::int32_t> tokens(static_cast<std::size_t>(B * T));
        for (std::int32_t& t : tokens) t = static_cast<std::int32_t>(rng.below(static_cast<std::uint32_t>(c.vocab_size)));
        write_case(out / "fp32", c, w, snug::DType::f32, tokens);
        write_case(out / "bf16", c, w, snug::DType::bf16, tokens);
        const snug::LlamaConfig lc = llama_config();
        const std::vector<float> lw = llama_weights(lc);
        write_case(out / "llama_fp32", lc, lw, snug::DType::f32, tokens);
        write_case(out / "llama_bf16", lc, lw, snug::DType::bf16, tokens);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "export_reference: %s\n", e.what());
        return 1;
    }
    return 0;
}
