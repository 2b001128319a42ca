// A run's data: llm.c token ids are checked against the vocabulary of the
// model they feed — a model read with --init-from, --vocab, else GPT-2's —
// and an id out of range fails naming the file, the id and the vocabulary.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "snug/data/token_file.hpp"
#include "snug/io/llmc_model.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/train/data_source.hpp"
#include "snug/train/model_source.hpp"
#include "support/temp_dir.hpp"

namespace {

std::vector<std::int32_t> ramp(int n, int vocab) {
    std::vector<std::int32_t> t(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = (i * 7) % vocab;
    return t;
}

snug::GPTConfig tiny(int vocab) {
    snug::GPTConfig c = snug::GPTConfig{}.with_vocab(vocab).with_context(16);
    c.n_layer = 1;
    c.n_head = 2;
    c.channels = 16;
    return c;
}

}  // namespace

TEST_CASE("data source: token files are read against the --init-from model's vocabulary, not GPT-2's") {
    snug::test::TempDir dir;
    const auto tokens = (dir.path / "train_000.bin").string();
    snug::data::write_token_file(tokens, ramp(4000, 256));
    const auto model = (dir.path / "model.bin").string();
    const snug::GPTConfig config = tiny(256);
    snug::io::write_llmc_model(model, config, snug::gpt_initial_weights(config, 1));

    snug::TrainOptions o;
    o.data = "tokens:" + tokens;
    o.init_from = model;
    o.run.micro_batch = 2;
    o.run.seq = 16;
    o.eval_batches = 1;
    // Before, the data was taken as 50,257 tokens and this model of 256 refused.
    const snug::RunInputs in = snug::load_inputs(o, 1000);
    CHECK(in.data.vocab == 256);
    CHECK(in.source.config.vocab_size == 256);
    CHECK_FALSE(in.data.train.empty());
}

TEST_CASE("data source: a token id out of the model's vocabulary names the file, the id and the vocabulary") {
    snug::test::TempDir dir;
    const auto tokens = (dir.path / "wide.bin").string();
    std::vector<std::int32_t> ids = ramp(1000, 256);
    ids[500] = 300;
    snug::data::write_token_file(tokens, ids);
    const auto model = (dir.path / "model.bin").string();
    const snug::GPTConfig config = tiny(256);
    snug::io::write_llmc_model(model, config, snug::gpt_initial_weights(config, 1));

    snug::TrainOptions o;
    o.data = "tokens:" + tokens;
    o.init_from = model;
    o.run.seq = 16;
    CHECK_THROWS_WITH(snug::load_inputs(o, 1000),
                      Catch::Contains("wide.bin") && Catch::Contains("token id 300 at position 500") &&
                          Catch::Contains("out of range for a vocabulary of 256"));
    // A fresh model: --vocab sets the range, else GPT-2's 50,257 tokens.
    snug::TrainOptions fresh;
    fresh.data = "tokens:" + tokens;
    fresh.layers = 1;
    fresh.heads = 2;
    fresh.channels = 16;
    fresh.run.seq = 16;
    fresh.vocab = 256;
    CHECK_THROWS_WITH(snug::load_inputs(fresh, 1000), Catch::Contains("out of range for a vocabulary of 256"));
    fresh.vocab = 512;
    CHECK(snug::load_inputs(fresh, 1000).source.config.vocab_size == 512);
    fresh.vocab = 0;
    CHECK(snug::load_inputs(fresh, 1000).data.vocab == snug::gpt2_vocab);
}
