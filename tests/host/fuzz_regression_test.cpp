// The fuzzers' findings, replayed on every test run: each input under
// tests/data/fuzz_regressions/<target>/ goes through the same target code the
// fuzzer ran (tests/fuzz/targets.hpp) and must be refused with snug::Error
// (of the listed kind) whose message names the file and holds the listed
// words; any other exception, a crash, or a clean load fails. Every committed
// input needs an entry below and every entry its input, so a new finding
// comes with what its message must say.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <typeinfo>
#include <vector>

#include "fuzz/targets.hpp"
#include "snug/io/file.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;

namespace {

struct Finding {
    const char* target;
    const char* input;                // file name under fuzz_regressions/<target>/
    std::vector<const char*> words;   // what the error message must contain
    const char* problem;              // what was wrong before the fix (for the reader of this list)
};

const std::vector<Finding>& findings() {
    static const std::vector<Finding> list = {
        // ---- llm.c model files (io/llmc_model.hpp) ----
        {"llmc_model", "layers_65536_in_2_KiB", {"model.bin", "65536 layers", "need at least", "truncated"},
         "found by fuzz_llmc_model: a 2 KiB file whose header claimed 65536 layers had its 786432 tensor names "
         "laid out, each checked against all before it, for over a minute before the size check"},
        // ---- tokenizer (data/tokenizer.hpp) ----
        {"tokenizer", "vocab_size_beyond_the_file", {"tokenizer.bin", "vocabulary of 16777216", "needs at least"},
         "found by fuzz_tokenizer: a 1 KiB file whose header promised 2^24 tokens reserved 128 MiB of offsets "
         "before reading any token"},
        // ---- safetensors (io/safetensors.hpp) ----
        {"safetensors", "dimension_1e300", {"tensor 'empty'", "'shape[1]' is 1e+300", "not an integer >= 0"},
         "found by fuzz_safetensors: a shape of floats went through get<vector<int64>>, whose conversion of 1e300 "
         "is undefined behaviour"},
        {"safetensors", "data_offsets_minus_1e300", {"tensor 'bf32'", "'data_offsets[1]' is -1e+300"},
         "found by fuzz_safetensors: data_offsets of floats, the same undefined conversion to uint64"},
        {"safetensors", "element_count_overflows", {"tensor 'empty'", "(9223372036854775807, 3)", "64-bit count"},
         "found by fuzz_safetensors: the element count of a huge shape overflowed int64 (undefined behaviour)"},
        {"safetensors", "dimension_int64_min", {"tensor 'bf16'", "'shape[0]' is -9223372036854775808"},
         "found by fuzz_safetensors: a negative dimension times the element size overflowed int64"},
        {"safetensors", "byte_count_wraps_to_zero", {"tensor 't'", "(2305843009213693952)", "64-bit count"},
         "by reading the code: an F64 shape of 2^61 elements has 2^64 bytes, which wrapped to 0 and matched an "
         "empty byte range; values() then asked for 2^61 floats (std::length_error escaped)"},
        {"safetensors", "negative_shape", {"tensor 't'", "'shape[0]' is -1,"},
         "by reading the code: shape (-1, -1) has 'numel' 1 and loaded with 4 bytes"},
        {"safetensors", "fractional_dimension", {"tensor 't'", "'shape[0]' is 1.5"},
         "by reading the code: shape [1.5] was read as [1] and loaded"},
        {"safetensors", "overlapping_tensors", {"tensors 'a'", "'b'", "overlap"},
         "by reading the code: two tensors on the same bytes loaded (the format forbids it)"},
        {"safetensors", "metadata_not_an_object", {"__metadata__", "not an object of strings"},
         "by reading the code: __metadata__ that is not an object of strings was silently dropped"},
        // ---- Hugging Face directory (io/hf_export.hpp: import_hf_gpt2) ----
        {"hf_import", "n_embd_2pow31", {"config.json", "'n_embd' is 2147483648", "[1, 2147483647]"},
         "found by fuzz_hf_import: get<int> wrapped n_embd 2^31 to -2^31, and 4 * n_embd (n_inner) overflowed int"},
        {"hf_import", "layout_overflows", {"n_embd 2147483647", "parameters", "holds only 348 values"},
         "found by fuzz_hf_import: n_embd 2^31 - 1 overflowed int64 in the parameter layout (12 C^2)"},
        {"hf_import", "vocab_size_int_max", {"vocab_size 2147483647", "holds only 348 values"},
         "found by fuzz_hf_import: GPTConfig::pad_vocab(2^31 - 1) overflowed int"},
        {"hf_import", "weights_dimension_minus_1e300", {"model.safetensors", "'shape[0]' is -1e+300"},
         "found by fuzz_hf_import: the safetensors float-shape conversion, reached through a directory"},
        {"hf_import", "n_layer_1e8", {"n_layer 100000000", "holds only 300 values", "do not match"},
         "by reading the code: a config.json with n_layer 1e8 built 1.2e9 tensor names and asked for 2.4e10 "
         "floats before looking at the weights file"},
        {"hf_import", "padded_vocab_2e9", {"padded_vocab_size '2000000000'", "[8, 136]"},
         "by reading the code: metadata padded_vocab_size 2e9 allocated 2e9 padded wte rows (32 GB)"},
        {"hf_import", "padded_vocab_negative", {"padded_vocab_size '-5'"},
         "by reading the code: a negative padded_vocab_size in the metadata was silently ignored"},
        {"hf_import", "n_embd_beyond_int32", {"'n_embd' is 4294967300"},
         "by reading the code: n_embd 2^32 + 4 wrapped to 4 and the model loaded as if the file said 4"},
        // ---- Hugging Face Llama directory (io/hf_llama.hpp: import_hf_llama) ----
        {"hf_llama", "channels_not_a_multiple_of_heads",
         {"config.json", "channels 9 must be a positive multiple of heads 2"},
         "found by fuzz_hf_llama: hidden_size 9 with 2 heads (head_dim 4, as 9 / 2 rounds) reached the attention "
         "layer's ShapeError, which did not name the file"},
        // ---- training-state files (train/state_file.hpp) ----
        {"state_file", "beta1_beyond_float", {"state.snug", "'optimizer.beta1' is 1e+300", "32-bit float"},
         "by reading the code: a float field of 1e300 became inf without a word (the format says each float "
         "field holds a float's value)"},
        {"state_file", "wall_clock_negative", {"'progress.wall_clock_seconds' is -1.5", "not >= 0"},
         "by reading the code: a negative wall_clock_seconds loaded, though the format and the writer say >= 0"},
    };
    return list;
}

const fs::path root = fs::path(SNUG_TEST_DATA_DIR) / "fuzz_regressions";

std::vector<fs::path> committed_inputs() {
    std::vector<fs::path> out;
    if (!fs::exists(root)) return out;
    for (const auto& e : fs::recursive_directory_iterator(root))
        if (e.is_regular_file()) out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace

TEST_CASE("every committed fuzz finding is refused with snug::Error naming the file and the problem") {
    const std::vector<fs::path> inputs = committed_inputs();
    for (const fs::path& path : inputs) {
        const std::string target = path.parent_path().filename().string();
        const std::string input = path.filename().string();
        DYNAMIC_SECTION(target << "/" << input) {
            const auto* t = snug::fuzz::find_target(target);
            INFO("fuzz_regressions/" << target << " is not a fuzz target's name");
            REQUIRE(t != nullptr);
            const auto f = std::find_if(findings().begin(), findings().end(), [&](const Finding& x) {
                return target == x.target && input == x.input;
            });
            INFO("fuzz_regressions/" << target << "/" << input << " has no entry in findings()");
            REQUIRE(f != findings().end());
            INFO(f->problem);

            snug::test::TempDir dir("snug-fuzz-regression-");
            const snug::fuzz::Scratch scratch(dir.path);
            const std::vector<unsigned char> bytes = snug::io::read_file(path);
            std::string message;
            bool threw_snug_error = false;
            try {
                t->run(snug::fuzz::Bytes(bytes.data(), bytes.size()), scratch);
            } catch (const snug::Error& e) {
                threw_snug_error = true;
                message = e.what();
                CHECK_NOTHROW(snug::fuzz::check_error(e, dir.path));
            } catch (const std::exception& e) {
                FAIL("an exception that is not snug::Error: " << typeid(e).name() << ": " << e.what());
            }
            INFO("message: " << message);
            REQUIRE(threw_snug_error);
            for (const char* w : f->words) CHECK_THAT(message, Catch::Contains(w));
        }
    }
}

TEST_CASE("every fuzz finding listed has its committed input") {
    std::set<std::string> have;
    for (const fs::path& p : committed_inputs())
        have.insert(p.parent_path().filename().string() + "/" + p.filename().string());
    for (const Finding& f : findings()) {
        const std::string key = std::string(f.target) + "/" + f.input;
        INFO(key);
        CHECK(have.count(key) == 1);
    }
}
