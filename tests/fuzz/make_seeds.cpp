// The fuzzers' seed corpus, made by snug's own writers so that the seeds
// follow the formats as they are today: `make_seeds DIR` writes a few small
// valid inputs per target into DIR/<target>/ (in each target's input format,
// see targets.hpp), and checks that each one loads.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz/targets.hpp"
#include "snug/io/file.hpp"

namespace fs = std::filesystem;
namespace fuzz = snug::fuzz;
using ByteVec = std::vector<unsigned char>;

namespace {

int written = 0;

void put(const fs::path& out, const char* target, const std::string& name, const ByteVec& bytes) {
    const fs::path dir = out / target;
    fs::create_directories(dir);
    std::FILE* f = std::fopen((dir / name).c_str(), "wb");
    if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0)
        throw std::runtime_error("cannot write " + (dir / name).string());
    // Every seed must load: a seed that fails would start the fuzzer off an error path.
    const fuzz::Scratch check(out / ".check");
    fuzz::find_target(target)->run(fuzz::Bytes(bytes.data(), bytes.size()), check);
    ++written;
}

ByteVec concat(std::initializer_list<const ByteVec*> parts) {
    ByteVec out;
    for (const ByteVec* p : parts) out.insert(out.end(), p->begin(), p->end());
    return out;
}

ByteVec text(std::string_view s) { return ByteVec(s.begin(), s.end()); }

std::vector<float> ramp(std::size_t n) {
    std::vector<float> w(n);
    for (std::size_t i = 0; i < n; ++i) w[i] = 0.01f * static_cast<float>(static_cast<int>(i % 37) - 18);
    return w;
}

ByteVec tokenizer_bytes(const std::vector<std::string>& vocab, std::uint32_t version, std::uint32_t eot) {
    std::uint32_t header[256] = {};
    header[0] = snug::data::tokenizer_file_magic;
    header[1] = version;
    header[2] = static_cast<std::uint32_t>(vocab.size());
    header[3] = eot;
    ByteVec b(sizeof header);
    std::memcpy(b.data(), header, sizeof header);
    for (const std::string& t : vocab) {
        b.push_back(static_cast<unsigned char>(t.size()));
        b.insert(b.end(), t.begin(), t.end());
    }
    return b;
}

snug::io::SafeTensor tensor(snug::DType dtype, std::vector<std::int64_t> shape, std::uint8_t fill) {
    snug::io::SafeTensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.bytes.resize(static_cast<std::size_t>(t.numel()) * snug::dtype_size(dtype));
    for (std::size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = static_cast<unsigned char>(fill + 7 * i);
    return t;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: make_seeds DIR (writes DIR/<target>/...)\n");
        return 2;
    }
    const fs::path out = argv[1];
    const fuzz::Scratch tmp(out / ".tmp");
    try {
        const snug::GPTConfig tiny = fuzz::tiny_gpt();
        const std::vector<float> w = ramp(static_cast<std::size_t>(snug::GPTLayout(tiny).total()));

        // llm.c model files: fp32 and bf16, and a second shape (2 layers, 2 heads, padded vocabulary).
        snug::GPTConfig other = tiny;
        other.n_layer = 2;
        other.n_head = 2;
        other.vocab_size = 6;
        const std::vector<float> w2 = ramp(static_cast<std::size_t>(snug::GPTLayout(other).total()));
        snug::io::write_llmc_model(tmp.dir() / "m", tiny, w, snug::io::LlmcVersion::fp32);
        put(out, "llmc_model", "tiny_fp32.bin", snug::io::read_file(tmp.dir() / "m"));
        snug::io::write_llmc_model(tmp.dir() / "m", tiny, w, snug::io::LlmcVersion::bf16);
        put(out, "llmc_model", "tiny_bf16.bin", snug::io::read_file(tmp.dir() / "m"));
        snug::io::write_llmc_model(tmp.dir() / "m", other, w2, snug::io::LlmcVersion::bf16);
        put(out, "llmc_model", "two_layers_bf16.bin", snug::io::read_file(tmp.dir() / "m"));

        // Token files (and text).
        std::vector<std::int32_t> ids;
        for (int i = 0; i < 40; ++i) ids.push_back((i * 37) % 256);
        snug::data::write_token_file(tmp.dir() / "t", ids);
        put(out, "token_file", "tokens_40.bin", snug::io::read_file(tmp.dir() / "t"));
        snug::data::write_token_file(tmp.dir() / "t", std::vector<std::int32_t>{50256, 0, 1000, 50000});
        put(out, "token_file", "gpt2_ids.bin", snug::io::read_file(tmp.dir() / "t"));
        put(out, "token_file", "text.txt", text("To be, or not to be, that is the question.\n"));

        // Tokenizer files, version 1 and 2.
        const std::vector<std::string> vocab = {"a", "b", "c", " the", "\n", "\xe2\x82", "\xac", "<|endoftext|>"};
        put(out, "tokenizer", "v1.bin", tokenizer_bytes(vocab, 1, 0));
        put(out, "tokenizer", "v2.bin", tokenizer_bytes(vocab, 2, 7));

        // Safetensors: every dtype snug reads, metadata, and a tiny GPT-2 export.
        std::map<std::string, snug::io::SafeTensor> tensors;
        tensors.emplace("f32", tensor(snug::DType::f32, {2, 3}, 1));
        tensors.emplace("f64", tensor(snug::DType::f64, {2}, 2));
        tensors.emplace("f16", tensor(snug::DType::f16, {3}, 3));
        tensors.emplace("bf16", tensor(snug::DType::bf16, {1, 2, 2}, 4));
        tensors.emplace("i32", tensor(snug::DType::i32, {4}, 5));
        tensors.emplace("u16", tensor(snug::DType::u16, {2}, 6));
        tensors.emplace("u8", tensor(snug::DType::u8, {5}, 7));
        tensors.emplace("scalar", tensor(snug::DType::f32, {}, 8));
        tensors.emplace("empty", tensor(snug::DType::f32, {0, 3}, 9));
        snug::io::write_safetensors(tmp.dir() / "s", tensors, {{"format", "pt"}, {"note", "seed"}});
        put(out, "safetensors", "dtypes.safetensors", snug::io::read_file(tmp.dir() / "s"));
        snug::io::write_safetensors(tmp.dir() / "s", {});
        put(out, "safetensors", "no_tensors.safetensors", snug::io::read_file(tmp.dir() / "s"));

        // Hugging Face directories: fp32 and bf16 exports, and one in
        // GPT2LMHeadModel's naming (prefix, tied lm_head, attention buffers).
        const ByteVec split = text(fuzz::hf_split);
        for (const auto& [name, dtype] : {std::pair{"f32", snug::DType::f32}, std::pair{"bf16", snug::DType::bf16}}) {
            const fs::path dir = tmp.dir() / (std::string("hf_") + name);
            snug::io::export_hf_gpt2(dir, tiny, w, dtype);
            const ByteVec config = snug::io::read_file(dir / snug::io::hf_config_file);
            const ByteVec weights = snug::io::read_file(dir / snug::io::hf_weights_file);
            put(out, "hf_import", std::string("tiny_") + name, concat({&config, &split, &weights}));
            put(out, "safetensors", std::string("gpt2_tiny_") + name + ".safetensors", weights);
        }
        {
            const fs::path dir = tmp.dir() / "hf_f32";
            const snug::io::SafetensorsFile exported(dir / snug::io::hf_weights_file);
            std::map<std::string, snug::io::SafeTensor> lm;
            for (const auto& [name, t] : exported.tensors()) lm.emplace("transformer." + name, t);
            lm.emplace("lm_head.weight", exported.at("wte.weight"));
            lm.emplace("transformer.h.0.attn.bias", tensor(snug::DType::f32, {1, 1, 4, 4}, 0));
            snug::io::write_safetensors(tmp.dir() / "lm.safetensors", lm, {{"format", "pt"}});
            const ByteVec config = snug::io::read_file(dir / snug::io::hf_config_file);
            const ByteVec weights = snug::io::read_file(tmp.dir() / "lm.safetensors");
            put(out, "hf_import", "tiny_lm_head", concat({&config, &split, &weights}));
        }

        // Hugging Face Llama directories: fp32 and bf16 exports, and one with
        // a tied head (no lm_head.weight) and a rotary buffer.
        {
            const snug::LlamaConfig llama = snug::make_llama_config(10, 8, 2, 8, 2, 12);
            snug::MemoryTracker tracker;
            const snug::Llama<float, snug::Meter> shape_only(llama, tracker);
            const std::vector<float> lw = shape_only.initial_weights(3);
            for (const auto& [name, dtype] : {std::pair{"f32", snug::DType::f32}, std::pair{"bf16", snug::DType::bf16}}) {
                const fs::path dir = tmp.dir() / (std::string("llama_") + name);
                snug::io::export_hf_llama(dir, llama, lw, dtype);
                const ByteVec config = snug::io::read_file(dir / snug::io::hf_config_file);
                const ByteVec weights = snug::io::read_file(dir / snug::io::hf_weights_file);
                put(out, "hf_llama", std::string("tiny_") + name, concat({&config, &split, &weights}));
            }
            const fs::path dir = tmp.dir() / "llama_f32";
            std::map<std::string, snug::io::SafeTensor> tied = snug::io::SafetensorsFile(dir / snug::io::hf_weights_file).tensors();
            tied.erase("lm_head.weight");
            tied.emplace("model.layers.0.self_attn.rotary_emb.inv_freq", tensor(snug::DType::f32, {2}, 1));
            snug::io::write_safetensors(tmp.dir() / "tied.safetensors", tied, {{"format", "pt"}});
            nlohmann::json j = nlohmann::json::parse(snug::io::read_file(dir / snug::io::hf_config_file));
            j["tie_word_embeddings"] = true;
            const ByteVec config = text(j.dump(1));
            const ByteVec weights = snug::io::read_file(tmp.dir() / "tied.safetensors");
            put(out, "hf_llama", "tiny_tied", concat({&config, &split, &weights}));
        }
        // A grouped-query Llama: 2 query heads sharing 1 key/value head.
        {
            const snug::LlamaConfig llama = snug::make_llama_config(10, 8, 2, 8, 2, 12, 1);
            snug::MemoryTracker tracker;
            const snug::Llama<float, snug::Meter> shape_only(llama, tracker);
            const fs::path dir = tmp.dir() / "llama_grouped";
            snug::io::export_hf_llama(dir, llama, shape_only.initial_weights(4), snug::DType::f32);
            const ByteVec config = snug::io::read_file(dir / snug::io::hf_config_file);
            const ByteVec weights = snug::io::read_file(dir / snug::io::hf_weights_file);
            put(out, "hf_llama", "tiny_grouped", concat({&config, &split, &weights}));
        }

        // Training-state files of the five tiny steps, each raw (mode 0) and
        // with the CRCs fixed up by the target (mode 1).
        fuzz::TinySteps& steps = fuzz::tiny_steps();
        snug::TrainingProgress progress;
        progress.step = 3;
        progress.tokens = 96;
        progress.seed = 42;
        progress.wall_clock_seconds = 1.5;
        progress.run_config = R"({"model": "tiny"})";
        auto state = [&](const char* name, auto& s) {
            snug::save_training_state(tmp.dir() / "state", s.step, s.device, progress);
            const ByteVec file = snug::io::read_file(tmp.dir() / "state");
            for (unsigned char mode : {0, 1}) {
                ByteVec b{mode};
                b.insert(b.end(), file.begin(), file.end());
                put(out, "state_file", std::string(name) + (mode ? "_fixcrc" : "_raw"), b);
            }
        };
        state("fp32", steps.fp32);
        state("bf16", steps.bf16);
        state("fp16_dynamic", steps.fp16_dynamic);
        state("fp16_static", steps.fp16_static);
        state("llama", steps.llama);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "make_seeds: %s\n", e.what());
        return 1;
    }
    std::error_code ec;
    fs::remove_all(out / ".tmp", ec);
    fs::remove_all(out / ".check", ec);
    std::printf("make_seeds: %d seeds in %s\n", written, out.c_str());
    return 0;
}
