// The training-state file on the host: CRC-32 against known answers and a
// bitwise reference; saving after 3 updates, loading into freshly built
// objects and training 3 more gives every byte of 6 straight updates (fp32,
// bf16, fp16 with dynamic and static loss scalers); the file's bytes follow
// the spec comment (sizes, offsets, checksums computed here independently);
// every load error comes from a crafted file and leaves the step untouched; a
// failed save leaves the previous file byte for byte.
#include <catch2/catch.hpp>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <sys/resource.h>

#include "snug/core/rng.hpp"
#include "snug/data/loader.hpp"
#include "snug/io/file.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/nn/llama.hpp"
#include "snug/train/state_file.hpp"
#include "support/host_run.hpp"
#include "support/temp_dir.hpp"

using snug::GPTConfig;
using snug::Host;
using snug::TrainingProgress;
using Bytes = std::vector<unsigned char>;

namespace {

// ---- an independent CRC-32: one bit at a time, the reflected polynomial ----
std::uint32_t crc32_bitwise(const unsigned char* p, std::size_t n) {
    std::uint32_t c = 0xFFFFFFFFu;
    for (std::size_t i = 0; i < n; ++i) {
        c ^= p[i];
        for (int b = 0; b < 8; ++b) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

std::uint64_t le(const Bytes& b, std::size_t at, int n) {
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | b[at + static_cast<std::size_t>(i)];
    return v;
}
void put_le32(Bytes& b, std::size_t at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<unsigned char>(v >> (8 * i));
}
std::uint64_t up64(std::uint64_t x) { return (x + 63) / 64 * 64; }

void write_bytes(const std::filesystem::path& p, const Bytes& b) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

template <class T>
Bytes bytes_of(const T* p, std::int64_t n) {
    const auto* c = reinterpret_cast<const unsigned char*>(p);
    return Bytes(c, c + n * static_cast<std::int64_t>(sizeof(T)));
}

// ---- a tiny GPT trained from a BatchLoader ----

constexpr int B = 4, T = 16, micro = 2;

// 2 layers, 2 heads, 32 channels, vocabulary 64, context 16.
GPTConfig tiny(int n_head = 2, int channels = 32) {
    GPTConfig c;
    c.vocab_size = 64;
    c.padded_vocab_size = 64;
    c.max_seq_len = 16;
    c.n_layer = 2;
    c.n_head = n_head;
    c.channels = channels;
    return c;
}
// Its parameter count by hand: V C + maxT C + L (12 C^2 + 13 C) + 2 C with
// V = 64, maxT = 16, L = 2, C = 32: 2048 + 512 + 2 (12288 + 416) + 64.
constexpr std::int64_t tiny_parameters = 28032;

// Fixed random tokens: 5 batches and a bit, so 12 batches wrap the stream.
std::vector<std::int32_t> corpus() {
    snug::Generator g(2024);
    std::vector<std::int32_t> t(5 * B * T + 7);
    for (auto& x : t) x = static_cast<std::int32_t>(g.below(64));
    return t;
}

snug::TrainConfig train_config(float beta2 = 0.95f) {
    snug::TrainConfig tc;
    tc.adamw.beta2 = beta2;
    tc.max_grad_norm = 1.0f;
    return tc;
}

// Everything the file restores, as bytes and numbers.
struct Snapshot {
    Bytes params;
    std::vector<Bytes> state;  // every buffer of the optimizer's state, as stored
    int optimizer_steps = 0;
    std::int64_t skipped = 0;
    std::optional<snug::LossScalerState> scaler;
    std::int64_t position = 0;
};

bool same_scaler(const std::optional<snug::LossScalerState>& a, const std::optional<snug::LossScalerState>& b) {
    if (a.has_value() != b.has_value()) return false;
    if (!a) return true;
    return std::memcmp(&a->scale, &b->scale, sizeof(float)) == 0 && a->growth_tracker == b->growth_tracker &&
           a->skipped == b->skipped && a->steps == b->steps;
}

void check_same(const Snapshot& a, const Snapshot& b) {
    CHECK(a.params == b.params);
    CHECK(a.state == b.state);
    CHECK(a.optimizer_steps == b.optimizer_steps);
    CHECK(a.skipped == b.skipped);
    CHECK(same_scaler(a.scaler, b.scaler));
    CHECK(a.position == b.position);
}

// A tiny GPT by default; any TrainableModel with a config() (a Llama).
template <class Precision, class M = snug::GPT<typename Precision::compute_type, Host>>
struct Session {
    using Act = typename Precision::compute_type;
    using Model = M;
    using Config = std::remove_cvref_t<decltype(std::declval<const Model&>().config())>;
    using Step = snug::TrainStep<Model, Precision, snug::accumulate::Steps, snug::checkpoint::EveryNth<2>>;

    snug::test::HostRun run;
    Model model;
    std::vector<float> w0;
    Step step;
    snug::data::BatchLoader loader;
    std::vector<std::int32_t> tokens, targets;
    std::int64_t updates = 0, tokens_seen = 0;

    Session(const Config& c, std::uint64_t init_seed, const Precision& precision,
            snug::TrainConfig tc = train_config())
        : model(c, run.tracker),
          w0(initial_weights(c, init_seed)),
          step(model, run.tracker, run.ctx.device, w0, tc, precision, snug::accumulate::Steps(micro)),
          loader(corpus(), B, T, "training data"),
          tokens(static_cast<std::size_t>(micro * B * T)),
          targets(tokens.size()) {
        model.load_weights(run.ctx.device, w0);
        run.ctx.seed = 4242 + init_seed;
    }

    std::vector<float> initial_weights(const Config& c, std::uint64_t seed) const {
        if constexpr (std::is_same_v<Config, GPTConfig>)
            return snug::gpt_initial_weights(c, seed);
        else
            return model.initial_weights(seed);
    }

    snug::StepResult update() {
        std::vector<snug::MicroBatch> mbs;
        for (int m = 0; m < micro; ++m) {
            loader.next(tokens.data() + m * B * T, targets.data() + m * B * T);
            mbs.push_back({tokens.data() + m * B * T, targets.data() + m * B * T});
        }
        // A learning rate that depends on the update index, as a schedule does.
        const float lr = 2e-3f * (1.0f + 0.25f * static_cast<float>(updates));
        const snug::StepResult r = step.step(run.ctx, mbs, B, T, lr);
        ++updates;
        tokens_seen += r.tokens;
        return r;
    }

    TrainingProgress progress() const {
        TrainingProgress p;
        p.step = updates;
        p.tokens = tokens_seen;
        p.train_position = loader.position();
        p.seed = run.ctx.seed;
        p.rng_offset = run.ctx.rng_offset;
        p.sampler_position = 0xFFFFFFFFFFFFFFF0ull;
        p.wall_clock_seconds = 12.375;
        p.run_config = R"({"model": "tiny", "note": "caf\u00e9"})";
        return p;
    }

    void apply(const TrainingProgress& p) {
        updates = p.step;
        tokens_seen = p.tokens;
        loader.set_position(p.train_position);
        run.ctx.seed = p.seed;
        run.ctx.rng_offset = p.rng_offset;
    }

    Snapshot snapshot() {
        const std::int64_t n = model.num_parameters();
        Snapshot s;
        s.params = bytes_of(model.parameters(), n);
        for (const snug::StateBuffer& b : step.optimizer().state_buffers())
            s.state.push_back(bytes_of(static_cast<const unsigned char*>(b.data),
                                       b.count * static_cast<std::int64_t>(snug::dtype_size(b.dtype))));
        s.optimizer_steps = step.optimizer().steps();
        s.skipped = step.skipped_steps();
        if constexpr (Precision::has_loss_scaler) s.scaler = step.scaler.state();
        s.position = loader.position();
        return s;
    }

    void save(const std::filesystem::path& p, const snug::StateFileOptions& o = {}) {
        snug::save_training_state(p, step, run.ctx.device, progress(), o);
    }
    TrainingProgress load(const std::filesystem::path& p, const snug::StateFileOptions& o = {}) {
        return snug::load_training_state(p, step, run.ctx.device, o);
    }
};

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// 6 updates straight against 3, save, destroy, rebuild, load, 3 more; the
// resumed step may place its optimizer elsewhere (resume_offload).
template <class Precision>
void resumes_bit_identically(const Precision& precision, const char* what, snug::TrainConfig tc = train_config(),
                             std::optional<bool> resume_offload = std::nullopt) {
    INFO(what);
    const GPTConfig c = tiny();
    snug::test::TempDir dir;
    const auto path = dir.path / "run.snugstate";

    std::vector<snug::StepResult> straight;
    Snapshot straight_end, straight_at_3;
    {
        auto s = std::make_unique<Session<Precision>>(c, 11, precision, tc);
        for (int i = 0; i < 6; ++i) {
            straight.push_back(s->update());
            if (i == 2) straight_at_3 = s->snapshot();
        }
        straight_end = s->snapshot();
    }
    TrainingProgress saved;
    {
        auto a = std::make_unique<Session<Precision>>(c, 11, precision, tc);
        for (int i = 0; i < 3; ++i) a->update();
        saved = a->progress();
        a->save(path);
    }
    std::vector<snug::StepResult> resumed;
    Snapshot resumed_end, loaded;
    {
        // Different initial weights and seed: everything must come from the file.
        snug::TrainConfig resume_tc = tc;
        resume_tc.adamw.offload = resume_offload.value_or(tc.adamw.offload);
        auto b = std::make_unique<Session<Precision>>(c, 999, precision, resume_tc);
        const TrainingProgress p = b->load(path);
        CHECK(p.step == 3);
        CHECK(p.tokens == 3 * micro * B * T);
        CHECK(p.train_position == saved.train_position);
        CHECK(p.seed == saved.seed);
        CHECK(p.rng_offset == saved.rng_offset);
        CHECK(p.sampler_position == 0xFFFFFFFFFFFFFFF0ull);
        CHECK(p.wall_clock_seconds == 12.375);
        CHECK(p.run_config == saved.run_config);
        b->apply(p);
        loaded = b->snapshot();
        for (int i = 0; i < 3; ++i) resumed.push_back(b->update());
        resumed_end = b->snapshot();
    }
    // The loaded state is the straight run's after 3 updates ...
    check_same(loaded, straight_at_3);
    // ... and the continuation is the straight run's updates 4-6, bit for bit.
    for (int i = 0; i < 3; ++i) {
        INFO("update " << i + 4);
        CHECK(same_bits(resumed[static_cast<std::size_t>(i)].loss, straight[static_cast<std::size_t>(i) + 3].loss));
        CHECK(same_bits(resumed[static_cast<std::size_t>(i)].grad_norm,
                        straight[static_cast<std::size_t>(i) + 3].grad_norm));
        CHECK(same_bits(resumed[static_cast<std::size_t>(i)].loss_scale,
                        straight[static_cast<std::size_t>(i) + 3].loss_scale));
        CHECK(resumed[static_cast<std::size_t>(i)].skipped == straight[static_cast<std::size_t>(i) + 3].skipped);
    }
    check_same(resumed_end, straight_end);
    // The run trained: 6 updates changed the weights and the loss fell.
    CHECK(straight_end.params != straight_at_3.params);
    CHECK(straight.back().loss < straight.front().loss);
    if constexpr (Precision::has_loss_scaler) {
        REQUIRE(straight_at_3.scaler.has_value());
        CHECK(straight_at_3.scaler->steps == 3);
    }
}

snug::precision::Fp16<snug::DynamicLossScaler> fp16_dynamic(float init, int growth_interval, float backoff = 0.5f) {
    snug::DynamicLossScalerConfig sc;
    sc.init_scale = init;
    sc.growth_interval = growth_interval;
    sc.backoff_factor = backoff;
    snug::precision::Fp16<snug::DynamicLossScaler> p;
    p.scaler = snug::DynamicLossScaler(sc);
    return p;
}

}  // namespace

TEST_CASE("CRC-32: known answers and a bitwise reference") {
    CHECK(snug::io::Crc32::of("123456789", 9) == 0xCBF43926u);
    CHECK(snug::io::Crc32::of("", 0) == 0x00000000u);
    CHECK(snug::io::Crc32::of("a", 1) == 0xE8B7BE43u);
    const char* fox = "The quick brown fox jumps over the lazy dog";
    CHECK(snug::io::Crc32::of(fox, std::strlen(fox)) == 0x414FA339u);
    // Every length 0..300 and every start offset 0..7 (the 8-byte slices and
    // the tail), whole and split in two updates.
    snug::Generator g(7);
    Bytes data(310);
    for (auto& b : data) b = static_cast<unsigned char>(g.below(256));
    for (std::size_t start = 0; start < 8; ++start) {
        for (std::size_t n = 0; n + start <= 308 && n <= 300; n += (n < 40 ? 1 : 13)) {
            const std::uint32_t ref = crc32_bitwise(data.data() + start, n);
            INFO("start " << start << " length " << n);
            CHECK(snug::io::Crc32::of(data.data() + start, n) == ref);
            snug::io::Crc32 split;
            split.update(data.data() + start, n / 3);
            split.update(data.data() + start + n / 3, n - n / 3);
            CHECK(split.value() == ref);
        }
    }
}

TEST_CASE("resuming from a saved state continues bit for bit: fp32") {
    resumes_bit_identically(snug::precision::Fp32{}, "fp32");
}

TEST_CASE("resuming from a saved state continues bit for bit: bf16") {
    resumes_bit_identically(snug::precision::Bf16{}, "bf16");
}

TEST_CASE("resuming from a saved state continues bit for bit: fp16, dynamic scaler") {
    SECTION("the scale grew before the save (growth interval 2, initial scale 1024)") {
        // Growth after updates 2, 4 and 6: 1024 -> 2048 at the save -> 4096 -> 8192.
        const auto p = fp16_dynamic(1024.0f, 2);
        resumes_bit_identically(p, "fp16 grown");
        Session<snug::precision::Fp16<snug::DynamicLossScaler>> s(tiny(), 11, p);
        for (int i = 0; i < 3; ++i) s.update();
        CHECK(s.step.scaler.scale() == 2048.0f);
        CHECK(s.step.scaler.clean_steps_in_a_row() == 1);
    }
    SECTION("an overflow skipped the first update and backed the scale off") {
        // 2^40 overflows fp16 at once; the backoff 2^-20 goes to 2^20, which
        // does not; growth interval 3 leaves 2 clean steps pending at the save.
        const auto p = fp16_dynamic(0x1p40f, 3, 0x1p-20f);
        resumes_bit_identically(p, "fp16 overflowed");
        Session<snug::precision::Fp16<snug::DynamicLossScaler>> s(tiny(), 11, p);
        CHECK(s.update().skipped);
        for (int i = 0; i < 2; ++i) CHECK_FALSE(s.update().skipped);
        CHECK(s.step.skipped_steps() == 1);
        CHECK(s.step.scaler.scale() == 0x1p20f);
        CHECK(s.step.scaler.clean_steps_in_a_row() == 2);
        CHECK(s.step.optimizer().steps() == 2);
    }
}

TEST_CASE("resuming from a saved state continues bit for bit: fp16, static scaler") {
    snug::precision::Fp16<snug::StaticLossScaler> p;
    p.scaler = snug::StaticLossScaler(512.0f);
    resumes_bit_identically(p, "fp16 static");
}

snug::TrainConfig lean(snug::MomentStorage moments, snug::MasterStorage master) {
    snug::TrainConfig tc = train_config();
    tc.adamw.moments = moments;
    tc.adamw.master = master;
    return tc;
}

TEST_CASE("resuming continues bit for bit with lean optimizer state") {
    using snug::MasterStorage;
    using snug::MomentStorage;
    SECTION("bf16 weights, bf16 moments, no master") {
        resumes_bit_identically(snug::precision::Bf16{}, "bf16 lean", lean(MomentStorage::bf16, MasterStorage::none));
    }
    SECTION("bf16 weights, fp32 moments, no master") {
        resumes_bit_identically(snug::precision::Bf16{}, "bf16 no master", lean(MomentStorage::fp32, MasterStorage::none));
    }
    SECTION("fp32 weights, bf16 moments") {
        resumes_bit_identically(snug::precision::Fp32{}, "fp32 bf16 moments", lean(MomentStorage::bf16, MasterStorage::fp32));
    }
    SECTION("bf16 weights, 8-bit moments, no master") {
        resumes_bit_identically(snug::precision::Bf16{}, "bf16 int8 lean", lean(MomentStorage::int8, MasterStorage::none));
    }
    SECTION("fp32 weights, 8-bit moments") {
        resumes_bit_identically(snug::precision::Fp32{}, "fp32 int8 moments", lean(MomentStorage::int8, MasterStorage::fp32));
    }
    SECTION("fp16 with bf16 or 8-bit moments: an overflow skips the first update and changes nothing") {
      for (const MomentStorage moments : {MomentStorage::bf16, MomentStorage::int8}) {
        INFO("moments " << snug::moment_storage_name(moments));
        const auto p = fp16_dynamic(0x1p40f, 3, 0x1p-20f);
        const snug::TrainConfig tc = lean(moments, MasterStorage::fp32);
        resumes_bit_identically(p, "fp16 lean moments overflowed", tc);
        Session<snug::precision::Fp16<snug::DynamicLossScaler>> s(tiny(), 11, p, tc);
        const Snapshot before = s.snapshot();
        CHECK(s.update().skipped);
        Snapshot after = s.snapshot();
        after.position = before.position;  // the data moved on; nothing else did
        after.scaler = before.scaler;      // the scaler backed off (checked in the fp16 test above)
        CHECK(after.skipped == 1);
        after.skipped = before.skipped;
        check_same(after, before);
        CHECK_FALSE(s.update().skipped);
        CHECK(s.step.optimizer().steps() == 1);
      }
    }
}

TEST_CASE("a state saved with one optimizer storage is refused by a step with another, naming both") {
    using snug::MasterStorage;
    using snug::MomentStorage;
    snug::test::TempDir dir;
    const auto path = dir.path / "lean.snugstate";
    {
        Session<snug::precision::Bf16> a(tiny(), 11, snug::precision::Bf16{}, lean(MomentStorage::bf16, MasterStorage::none));
        a.update();
        a.save(path);
    }
    using Catch::Matchers::Contains;
    {
        Session<snug::precision::Bf16> b(tiny(), 5, snug::precision::Bf16{});
        const Snapshot before = b.snapshot();
        CHECK_THROWS_WITH(b.load(path), Contains("moment storage") && Contains("bf16") && Contains("fp32"));
        check_same(b.snapshot(), before);
    }
    {
        Session<snug::precision::Bf16> b(tiny(), 5, snug::precision::Bf16{}, lean(MomentStorage::bf16, MasterStorage::fp32));
        const Snapshot before = b.snapshot();
        CHECK_THROWS_WITH(b.load(path), Contains("master weights") && Contains("none") && Contains("fp32"));
        check_same(b.snapshot(), before);
    }
    // The header says what the sections are.
    const snug::TrainingStateInfo info = snug::read_training_state_info(path);
    CHECK(info.adamw.moments == MomentStorage::bf16);
    CHECK(info.adamw.master == MasterStorage::none);
    REQUIRE(info.sections.size() == 3);
    CHECK(info.sections[1].name == "first_moment");
    CHECK(info.sections[1].dtype == snug::DType::bf16);
    CHECK(info.sections[2].dtype == snug::DType::bf16);
}

TEST_CASE("an 8-bit state's sections are the decayed groups' codes and absmax, and the others' fp32 moments") {
    // tiny()'s groups (llm.c's order, every tensor for all layers at once):
    // decayed wte + wpe 2560, qkv 6144, attention projection 2048, fc 8192,
    // fc projection 8192 (Q = 27136, each a whole number of 256-blocks: 106);
    // the biases and norms between them 896 (= 28032 - 27136).
    snug::test::TempDir dir;
    const auto path = dir.path / "int8.snugstate";
    Session<snug::precision::Bf16> a(tiny(), 11, snug::precision::Bf16{},
                                     lean(snug::MomentStorage::int8, snug::MasterStorage::none));
    a.update();
    a.save(path);
    const snug::TrainingStateInfo info = snug::read_training_state_info(path);
    CHECK(info.adamw.moments == snug::MomentStorage::int8);
    const std::pair<const char*, std::pair<snug::DType, std::int64_t>> want[] = {
        {"weights", {snug::DType::bf16, tiny_parameters}},
        {"first_moment_codes", {snug::DType::u8, 27136}},
        {"first_moment_absmax", {snug::DType::f32, 106}},
        {"second_moment_codes", {snug::DType::u8, 27136}},
        {"second_moment_absmax", {snug::DType::f32, 106}},
        {"first_moment", {snug::DType::f32, 896}},
        {"second_moment", {snug::DType::f32, 896}},
    };
    REQUIRE(info.sections.size() == std::size(want));
    for (std::size_t i = 0; i < std::size(want); ++i) {
        INFO("section " << i);
        CHECK(info.sections[i].name == want[i].first);
        CHECK(info.sections[i].dtype == want[i].second.first);
        CHECK(info.sections[i].count == want[i].second.second);
    }
    // Another storage of the same step is refused, naming both.
    Session<snug::precision::Bf16> b(tiny(), 5, snug::precision::Bf16{},
                                     lean(snug::MomentStorage::bf16, snug::MasterStorage::none));
    const Snapshot before = b.snapshot();
    using Catch::Matchers::Contains;
    CHECK_THROWS_WITH(b.load(path), Contains("moment storage") && Contains("int8") && Contains("bf16"));
    check_same(b.snapshot(), before);
}

TEST_CASE("a state saved with the optimizer offloaded resumes on the device, and the other way, bit for bit") {
    using snug::MasterStorage;
    using snug::MomentStorage;
    snug::TrainConfig offloaded = lean(MomentStorage::int8, MasterStorage::none);
    offloaded.adamw.offload = true;
    SECTION("bf16, 8-bit moments, no master: offloaded, then on the device") {
        resumes_bit_identically(snug::precision::Bf16{}, "bf16 int8 offloaded -> device", offloaded, false);
    }
    SECTION("fp32: on the device, then offloaded") {
        resumes_bit_identically(snug::precision::Fp32{}, "fp32 device -> offloaded", train_config(), true);
    }
    SECTION("fp16 with a master, offloaded both times") {
        snug::TrainConfig fp16 = train_config();
        fp16.adamw.offload = true;
        resumes_bit_identically(fp16_dynamic(0x1p12f, 3, 0x1p-20f), "fp16 offloaded", fp16);
    }
}

TEST_CASE("the file's bytes are what the format comment says") {
    snug::test::TempDir dir;
    auto check_layout = [&](auto precision, std::size_t elem, const char* dtype, int sections) {
        using P = decltype(precision);
        INFO(dtype);
        Session<P> s(tiny(), 3, precision);
        s.update();
        REQUIRE(s.model.num_parameters() == tiny_parameters);
        const auto path = dir.path / (std::string(dtype) + ".state");
        s.save(path);
        const Bytes f = snug::io::read_file(path);
        // The fixed header.
        REQUIRE(f.size() >= 32);
        CHECK(std::string(f.begin(), f.begin() + 8) == "SNUGTRST");
        CHECK(le(f, 8, 4) == 1);
        const std::uint64_t H = le(f, 12, 4);
        CHECK(le(f, 16, 8) == f.size());
        CHECK(le(f, 24, 4) == crc32_bitwise(f.data() + 32, H));
        CHECK(le(f, 28, 4) == crc32_bitwise(f.data(), 28));
        // The size: the data start after the JSON, rounded to 64; each record
        // is its payload and a 4-byte CRC, rounded to 64.
        const std::uint64_t data_offset = up64(32 + H);
        const std::uint64_t weights_record = up64(tiny_parameters * elem + 4);
        const std::uint64_t f32_record = up64(tiny_parameters * 4 + 4);
        CHECK(f.size() == data_offset + weights_record + static_cast<std::uint64_t>(sections - 1) * f32_record);
        for (std::uint64_t i = 32 + H; i < data_offset; ++i) CHECK(f[i] == 0);
        // The JSON header.
        const auto j = nlohmann::json::parse(f.begin() + 32, f.begin() + 32 + static_cast<std::ptrdiff_t>(H));
        CHECK(j["model"]["num_parameters"] == tiny_parameters);
        CHECK(j["model"]["dtype"] == dtype);
        CHECK(j["model"]["precision"] == P::name);
        CHECK(j["model"]["gpt"]["n_head"] == 2);
        CHECK(j["model"]["gpt"]["channels"] == 32);
        CHECK(j["model"]["gpt"]["attention"] == "flash");  // for information: a run may resume with the other
        CHECK(j["model"]["gpt"]["classifier_chunk"] == 0);  // automatic; for information too
        CHECK(j["optimizer"]["steps"] == 1);
        CHECK(j["optimizer"]["beta2"].get<double>() == static_cast<double>(0.95f));
        CHECK(j["progress"]["step"] == 1);
        CHECK(j["progress"]["sampler_position"].get<std::uint64_t>() == 0xFFFFFFFFFFFFFFF0ull);
        REQUIRE(j["sections"].size() == static_cast<std::size_t>(sections));
        // Each section: payload = the step's bytes at the spec's offset, then its CRC.
        std::vector<Bytes> expect{bytes_of(s.model.parameters(), tiny_parameters)};
        std::vector<std::string> names{"weights"};
        if (s.step.optimizer().master() != nullptr) {
            expect.push_back(bytes_of(s.step.optimizer().master(), tiny_parameters));
            names.emplace_back("master_weights");
        }
        expect.push_back(bytes_of(s.step.optimizer().first_moment(), tiny_parameters));
        expect.push_back(bytes_of(s.step.optimizer().second_moment(), tiny_parameters));
        names.emplace_back("first_moment");
        names.emplace_back("second_moment");
        std::uint64_t at = data_offset;
        for (std::size_t i = 0; i < expect.size(); ++i) {
            INFO(names[i]);
            CHECK(j["sections"][i]["name"] == names[i]);
            CHECK(j["sections"][i]["offset"].get<std::uint64_t>() == at - data_offset);
            CHECK(j["sections"][i]["count"] == tiny_parameters);
            REQUIRE(at + expect[i].size() + 4 <= f.size());
            CHECK(Bytes(f.begin() + static_cast<std::ptrdiff_t>(at),
                        f.begin() + static_cast<std::ptrdiff_t>(at + expect[i].size())) == expect[i]);
            CHECK(le(f, at + expect[i].size(), 4) == crc32_bitwise(expect[i].data(), expect[i].size()));
            at = up64(at + expect[i].size() + 4);
        }
        CHECK(at == f.size());
        // The header reader agrees.
        const snug::TrainingStateInfo info = snug::read_training_state_info(path);
        CHECK(info.file_bytes == f.size());
        CHECK(info.num_parameters == tiny_parameters);
        CHECK(info.optimizer_steps == 1);
        REQUIRE(info.gpt.has_value());
        CHECK(info.gpt->channels == 32);
        CHECK(info.progress.run_config == s.progress().run_config);
    };
    check_layout(snug::precision::Fp32{}, 4, "f32", 3);
    check_layout(snug::precision::Bf16{}, 2, "bf16", 4);
    check_layout(fp16_dynamic(1024.0f, 2), 2, "f16", 4);
}

TEST_CASE("small chunks write the same bytes and report progress up to the file size") {
    snug::test::TempDir dir;
    Session<snug::precision::Bf16> s(tiny(), 3, {});
    s.update();
    s.save(dir.path / "big-chunks");
    std::vector<std::uint64_t> seen;
    std::uint64_t total = 0;
    snug::StateFileOptions o;
    o.chunk_bytes = 1000;  // 28032 parameters: 29 or 57 chunks a section
    o.on_progress = [&](std::uint64_t done, std::uint64_t all) {
        seen.push_back(done);
        total = all;
    };
    s.save(dir.path / "small-chunks", o);
    const Bytes a = snug::io::read_file(dir.path / "big-chunks");
    CHECK(snug::io::read_file(dir.path / "small-chunks") == a);
    REQUIRE(seen.size() > 100);
    CHECK(std::is_sorted(seen.begin(), seen.end()));
    CHECK(seen.back() == a.size());
    CHECK(total == a.size());
    // Loading in small chunks gives the same state.
    Session<snug::precision::Bf16> t(tiny(), 8, {});
    snug::StateFileOptions small;
    small.chunk_bytes = 6;
    t.apply(t.load(dir.path / "small-chunks", small));
    check_same(t.snapshot(), s.snapshot());
}

namespace {

// Loads `file` into `into` expecting a FileError whose message contains every
// one of `parts` and the file's name; the step's state must not change.
template <class S>
void rejects(S& into, const std::filesystem::path& file, const std::vector<std::string>& parts) {
    const Snapshot before = into.snapshot();
    std::string message;
    try {
        into.load(file);
    } catch (const snug::FileError& e) {
        message = e.what();
    }
    INFO("message: " << message);
    REQUIRE_FALSE(message.empty());
    CHECK_THAT(message, Catch::Contains(file.string()));
    for (const std::string& p : parts) CHECK_THAT(message, Catch::Contains(p));
    check_same(into.snapshot(), before);
}

}  // namespace

TEST_CASE("load errors: each crafted file is reported and leaves the step unchanged") {
    snug::test::TempDir dir;
    auto at = [&](const char* name) { return dir.path / name; };
    // The file under test: an fp32 step after 2 updates. The target: another
    // fp32 step, trained differently, whose state must survive every failure.
    Session<snug::precision::Fp32> src(tiny(), 1, {});
    src.update();
    src.update();
    src.save(at("good"));
    const Bytes good = snug::io::read_file(at("good"));
    Session<snug::precision::Fp32> target(tiny(), 2, {});
    target.update();

    const std::uint64_t H = le(good, 12, 4);
    const std::uint64_t data_offset = up64(32 + H);
    const std::uint64_t record = up64(tiny_parameters * 4 + 4);  // fp32: weights, m, v
    auto crafted = [&](const char* name, auto edit) {
        Bytes b = good;
        edit(b);
        write_bytes(at(name), b);
        return at(name);
    };

    SECTION("a flipped byte in a section names the section") {
        rejects(target, crafted("flip-m", [&](Bytes& b) { b[data_offset + record + 1000] ^= 0x10; }),
                {"checksum mismatch", "first_moment"});
        rejects(target, crafted("flip-w", [&](Bytes& b) { b[data_offset] ^= 0x01; }), {"checksum mismatch", "weights"});
        // The last payload byte of the last section, and its stored CRC.
        const std::uint64_t v_end = data_offset + 2 * record + tiny_parameters * 4;
        rejects(target, crafted("flip-v", [&](Bytes& b) { b[v_end - 1] ^= 0x80; }),
                {"checksum mismatch", "second_moment"});
        rejects(target, crafted("flip-crc", [&](Bytes& b) { b[v_end + 2] ^= 0x04; }),
                {"checksum mismatch", "second_moment"});
    }
    SECTION("a flipped byte in the JSON header or the fixed header") {
        rejects(target, crafted("flip-json", [&](Bytes& b) { b[32 + H / 2] ^= 0x01; }),
                {"checksum mismatch", "JSON header"});
        rejects(target, crafted("flip-fixed", [&](Bytes& b) { b[13] ^= 0x01; }), {"checksum mismatch", "fixed header"});
    }
    SECTION("a truncated file names both sizes") {
        const auto cut = good.size() - 100;
        rejects(target, crafted("cut", [&](Bytes& b) { b.resize(cut); }),
                {"truncated", std::to_string(good.size()), std::to_string(cut)});
        rejects(target, crafted("cut-fixed", [&](Bytes& b) { b.resize(20); }), {"truncated", "32", "20"});
        rejects(target, crafted("longer", [&](Bytes& b) { b.push_back(0); }),
                {std::to_string(good.size()), std::to_string(good.size() + 1)});
    }
    SECTION("the wrong magic, an unsupported version, not a state file at all") {
        rejects(target, crafted("magic", [&](Bytes& b) { b[3] = 'X'; }), {"not a snug training-state file"});
        rejects(target, crafted("text", [&](Bytes& b) { b.assign(100, 'a'); }), {"not a snug training-state file"});
        rejects(target, crafted("empty", [&](Bytes& b) { b.clear(); }), {"not a snug training-state file"});
        rejects(target, crafted("version", [&](Bytes& b) { put_le32(b, 8, 2); }),
                {"unsupported", "version 2", "version 1"});
    }
    SECTION("a file that does not exist") {
        rejects(target, at("missing"), {"cannot open"});
    }
    SECTION("an fp32 file into a bf16 step names both dtypes") {
        Session<snug::precision::Bf16> bf(tiny(), 2, {});
        bf.update();
        rejects(bf, at("good"), {"dtype", "f32", "bf16"});
    }
    SECTION("a bf16 file into an fp16 step, and a dynamic-scaler file into a static-scaler step") {
        Session<snug::precision::Bf16> bf(tiny(), 2, {});
        bf.update();
        bf.save(at("bf16"));
        Session<snug::precision::Fp16<snug::DynamicLossScaler>> h(tiny(), 2, fp16_dynamic(1024.0f, 2));
        h.update();
        rejects(h, at("bf16"), {"dtype", "bf16", "f16"});
        h.save(at("fp16-dynamic"));
        snug::precision::Fp16<snug::StaticLossScaler> sp;
        Session<snug::precision::Fp16<snug::StaticLossScaler>> st(tiny(), 2, sp);
        st.update();
        rejects(st, at("fp16-dynamic"), {"loss scaler", "dynamic", "static"});
        // Another growth interval: the continuation would differ.
        Session<snug::precision::Fp16<snug::DynamicLossScaler>> h5(tiny(), 2, fp16_dynamic(1024.0f, 5));
        h5.update();
        rejects(h5, at("fp16-dynamic"), {"growth_interval", "2", "5"});
    }
    SECTION("a file for another shape names the differing field") {
        // n_head 4: the same parameter count, another model.
        Session<snug::precision::Fp32> heads(tiny(4), 2, {});
        heads.update();
        REQUIRE(heads.model.num_parameters() == tiny_parameters);
        rejects(heads, at("good"), {"n_head", "2", "4"});
        // 64 channels: 64 64 + 16 64 + 2 (12 64^2 + 13 64) + 2 64 = 105216 parameters.
        Session<snug::precision::Fp32> wide(tiny(2, 64), 2, {});
        wide.update();
        rejects(wide, at("good"), {"parameter count", std::to_string(tiny_parameters), "105216"});
    }
    SECTION("other optimizer hyper-parameters") {
        Session<snug::precision::Fp32> other(tiny(), 2, {}, train_config(0.99f));
        other.update();
        rejects(other, at("good"), {"beta2", "0.95", "0.99"});
    }
    // The good file still loads into the target afterwards.
    target.apply(target.load(at("good")));
    check_same(target.snapshot(), src.snapshot());
}

TEST_CASE("a failed save leaves the previous file byte for byte") {
    snug::test::TempDir dir;
    const auto path = dir.path / "state";
    Session<snug::precision::Bf16> s(tiny(), 5, {});
    s.update();
    s.save(path);
    const Bytes before = snug::io::read_file(path);
    s.update();  // the state changed: a completed save would change the file
    auto only_the_file = [&] {
        int n = 0;
        for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path)) ++n;
        return n == 1;
    };
    SECTION("the progress callback throws halfway") {
        struct Abort {};
        snug::StateFileOptions o;
        o.chunk_bytes = 4096;
        std::uint64_t last = 0;
        o.on_progress = [&](std::uint64_t done, std::uint64_t total) {
            last = done;
            if (done > total / 2) throw Abort{};
        };
        CHECK_THROWS_AS(s.save(path, o), Abort);
        CHECK(last > before.size() / 2);  // it got halfway through the data
        CHECK(snug::io::read_file(path) == before);
        CHECK(only_the_file());
    }
    SECTION("the file system refuses the write (the file-size limit)") {
        // RLIMIT_FSIZE below the file's size: write() fails with EFBIG partway.
        const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
        rlimit old{};
        REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
        rlimit small = old;
        small.rlim_cur = static_cast<rlim_t>(before.size() / 2);
        REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
        std::string message;
        try {
            snug::StateFileOptions o;
            o.chunk_bytes = 4096;
            s.save(path, o);
        } catch (const snug::FileError& e) {
            message = e.what();
        }
        setrlimit(RLIMIT_FSIZE, &old);
        std::signal(SIGXFSZ, old_handler);
        CHECK_THAT(message, Catch::Contains("write failed") && Catch::Contains(path.string()));
        CHECK(snug::io::read_file(path) == before);
        CHECK(only_the_file());
    }
    SECTION("a progress that cannot be stored is refused before the file is touched") {
        TrainingProgress p = s.progress();
        p.wall_clock_seconds = std::nan("");
        CHECK_THROWS_AS(snug::save_training_state(path, s.step, s.run.ctx.device, p), snug::ConfigError);
        p = s.progress();
        p.run_config = "\xff\xfe not UTF-8";
        CHECK_THROWS_WITH(snug::save_training_state(path, s.step, s.run.ctx.device, p), Catch::Contains("UTF-8"));
        p = s.progress();
        p.train_position = -1;
        CHECK_THROWS_AS(snug::save_training_state(path, s.step, s.run.ctx.device, p), snug::ConfigError);
        CHECK(snug::io::read_file(path) == before);
        CHECK(only_the_file());
    }
    SECTION("a save into a directory that does not exist names the path given, not a temporary file") {
        const std::filesystem::path missing = path.parent_path() / "no such dir" / "s.snug";
        CHECK_THROWS_WITH(s.save(missing), Catch::Equals(missing.string() + ": cannot write the file: its directory " +
                                                         missing.parent_path().string() +
                                                         " does not exist (make it first)"));
        CHECK_FALSE(std::filesystem::exists(missing.parent_path()));
        CHECK(only_the_file());
    }
    // A save that completes replaces the file.
    s.save(path);
    CHECK(snug::io::read_file(path) != before);
}

// ---- a CausalLM's state knows its model (nn/model_identity.hpp) ----

namespace {

// A tiny Llama over the test corpus: 2 layers, 32 channels, `heads` heads.
snug::LlamaConfig tiny_llama(int heads, int hidden = 64) {
    return snug::make_llama_config(64, 16, 2, 32, heads, hidden);
}
using LlamaSession = Session<snug::precision::Fp32, snug::Llama<float, Host>>;

}  // namespace

TEST_CASE("a Llama state resumes into its own shape and is refused by another of as many parameters") {
    snug::test::TempDir dir;
    const auto path = dir.path / "llama.snugstate";
    LlamaSession four(tiny_llama(4), 1, {});
    four.update();
    four.update();
    four.save(path);

    // The header names the family, the fields and every tensor.
    const snug::TrainingStateInfo info = snug::read_training_state_info(path);
    REQUIRE(info.identity.has_value());
    CHECK(info.identity->family == "llama");
    CHECK_FALSE(info.gpt.has_value());
    const auto field = [&](const char* name) {
        for (const snug::ModelField& f : info.identity->config)
            if (f.name == name) return f.value;
        FAIL("no field " << name);
        return -1.0;
    };
    CHECK(field("heads") == 4);
    CHECK(field("channels") == 32);
    CHECK(field("n_layer") == 2);
    CHECK(field("norm_eps") == snug::ops::rmsnorm_eps);
    // embed, 2 x (2 norms, qkv, o, gate_up, down), norm, head.
    REQUIRE(info.identity->tensors.size() == 1 + 2 * 6 + 2);
    CHECK(info.identity->tensors.front().name == "embed_tokens.weight");
    CHECK(info.identity->tensors.front().shape == std::vector<std::int64_t>{64, 32});
    CHECK(info.identity->tensors.back().name == "lm_head.weight");

    // The same shape resumes: the weights are the saved ones.
    LlamaSession again(tiny_llama(4), 2, {});
    again.load(path);
    CHECK(again.snapshot().params == four.snapshot().params);

    // Two heads of 16 channels hold as many parameters as four of 8: refused,
    // by the field, and the step keeps its state.
    LlamaSession two(tiny_llama(2), 3, {});
    two.update();
    REQUIRE(two.model.num_parameters() == four.model.num_parameters());
    rejects(two, path, {"the model does not match", "'heads'", "the file has 4", "this model has 2"});

    // Another epsilon: the same tensors, another model.
    snug::LlamaConfig eps = tiny_llama(4);
    eps.block.norm_eps = 1e-6;
    LlamaSession other_eps(eps, 3, {});
    rejects(other_eps, path, {"'norm_eps'", "1e-05", "1e-06"});

    // A GPT's state into a Llama: refused by the model kind.
    Session<snug::precision::Fp32> gpt(tiny(), 1, {});
    gpt.save(dir.path / "gpt.snugstate");
    rejects(two, dir.path / "gpt.snugstate", {"the model kind", "a GPT", "a llama model"});
}

TEST_CASE("first_difference names the first field or tensor where two models part") {
    snug::ModelIdentity a;
    a.family = "llama";
    a.config = {{"n_layer", 2}, {"heads", 4}};
    a.tensors = {{"embed", {64, 32}}, {"norm.weight", {32}}};
    CHECK(snug::first_difference(a, a).empty());

    snug::ModelIdentity b = a;
    b.family = "mine";
    CHECK(snug::first_difference(a, b) == "the model's family: the file has 'llama', this model has 'mine'");
    b = a;
    b.config[1].value = 2.5;
    CHECK(snug::first_difference(a, b) == "the config field 'heads': the file has 4, this model has 2.5");
    b = a;
    b.config.push_back({"hidden", 64});
    CHECK(snug::first_difference(a, b) == "the config field 'hidden': the file has none, this model has 64");
    CHECK(snug::first_difference(b, a) == "the config field 'hidden': the file has 64, this model has none");
    b = a;
    b.tensors[1].shape = {16, 2};
    CHECK(snug::first_difference(a, b) == "the shape of 'norm.weight': the file has (32), this model has (16, 2)");
    b = a;
    b.tensors[0].name = "wte";
    CHECK(snug::first_difference(a, b) == "tensor 0's name: the file has 'embed', this model has 'wte'");
    b = a;
    b.tensors.push_back({"lm_head", {64, 32}});
    CHECK(snug::first_difference(a, b) == "the number of tensors: the file has 2, this model has 3");
}

TEST_CASE("a Llama state whose model description is malformed is refused by field") {
    snug::test::TempDir dir;
    LlamaSession src(tiny_llama(4), 1, {});
    src.update();
    src.save(dir.path / "good");
    const Bytes good = snug::io::read_file(dir.path / "good");
    // Rewrite the model's part of the JSON header, padded with spaces to its
    // length (so the sections stay where they are), with both CRCs renewed.
    const std::uint64_t H = le(good, 12, 4);
    const std::string header(good.begin() + 32, good.begin() + 32 + static_cast<std::ptrdiff_t>(H));
    auto with_model = [&](const char* name, auto edit) {
        nlohmann::ordered_json j = nlohmann::ordered_json::parse(header);
        edit(j["model"]);
        std::string text = j.dump(1);
        // Keep the length, so the sections stay where they are.
        REQUIRE(text.size() <= H);
        text.append(H - text.size(), ' ');
        Bytes b = good;
        std::copy(text.begin(), text.end(), b.begin() + 32);
        put_le32(b, 24, crc32_bitwise(reinterpret_cast<const unsigned char*>(text.data()), text.size()));
        put_le32(b, 28, crc32_bitwise(b.data(), 28));  // the fixed header holds the JSON's CRC
        write_bytes(dir.path / name, b);
        return dir.path / name;
    };
    LlamaSession target(tiny_llama(4), 2, {});
    target.update();
    rejects(target, with_model("zero-dim", [](auto& m) { m["tensors"][3]["shape"][0] = 0; }),
            {"model.tensors[3].shape", "[1, 2^62]"});
    rejects(target, with_model("no-shape", [](auto& m) { m["tensors"][0].erase("shape"); }),
            {"model.tensors[0].shape", "missing"});
    rejects(target, with_model("text-field", [](auto& m) { m["config"]["rope_theta"] = "x"; }),
            {"model.config.rope_theta", "not a number"});
    rejects(target, with_model("no-family", [](auto& m) { m.erase("family"); }), {"model.family", "missing"});
    rejects(target, with_model("renamed", [](auto& m) { m["tensors"][1]["name"] = "layers.0.other"; }),
            {"tensor 1's name", "layers.0.other"});
}
