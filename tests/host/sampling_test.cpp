// train/sampling.hpp: which bytes of a sample print as they are (against a
// reference that decodes code points, a different method from the table the
// header uses), and sample_token's choices and frequencies.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "snug/core/rng.hpp"
#include "snug/train/sampling.hpp"

namespace {

// The length of the printable character at the start of s, or 0, by
// decoding: the lead byte's bit pattern gives the length, the code point is
// assembled from the payload bits and then judged (shortest form, no
// surrogate, at most U+10FFFF, no C0/C1 control but '\n', no DEL).
std::size_t reference_length(const std::string& s) {
    const auto b = [&](std::size_t i) { return static_cast<unsigned>(static_cast<unsigned char>(s[i])); };
    std::size_t n = 0;
    unsigned cp = 0;
    if ((b(0) & 0x80U) == 0) {
        n = 1, cp = b(0);
    } else if ((b(0) & 0xe0U) == 0xc0) {
        n = 2, cp = b(0) & 0x1fU;
    } else if ((b(0) & 0xf0U) == 0xe0) {
        n = 3, cp = b(0) & 0x0fU;
    } else if ((b(0) & 0xf8U) == 0xf0) {
        n = 4, cp = b(0) & 0x07U;
    } else {
        return 0;
    }
    if (s.size() < n) return 0;
    for (std::size_t i = 1; i < n; ++i) {
        if ((b(i) & 0xc0U) != 0x80) return 0;
        cp = (cp << 6) | (b(i) & 0x3fU);
    }
    const unsigned shortest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < shortest[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    if (cp < 0x20 && cp != '\n') return 0;
    if (cp >= 0x7f && cp <= 0x9f) return 0;
    return n;
}

std::string bytes(std::initializer_list<int> list) {
    std::string s;
    for (int c : list) s += static_cast<char>(c);
    return s;
}

}  // namespace

TEST_CASE("printable_char_length agrees with decoding every 1-, 2- and 3-byte string and 4-byte leads") {
    std::size_t checked = 0, mismatches = 0;
    const auto check = [&](const std::string& s) {
        ++checked;
        if (snug::printable_char_length(s) != reference_length(s)) {
            if (++mismatches <= 5) FAIL_CHECK("mismatch on " << snug::printable(s) << " (" << s.size() << " bytes)");
        }
    };
    for (int a = 0; a < 256; ++a) {
        check(bytes({a}));
        for (int c = 0; c < 256; ++c) check(bytes({a, c}));
    }
    for (int a = 0xe0; a < 0x100; ++a) {
        for (int c = 0; c < 256; ++c) {
            for (int d = 0; d < 256; ++d) check(bytes({a, c, d}));
        }
    }
    for (int a = 0xf0; a < 0xf8; ++a) {
        for (int c = 0; c < 256; ++c) {
            for (int d : {0x41, 0x80, 0xbf, 0xc0}) {
                for (int e : {0x41, 0x80, 0xbf, 0xc0}) check(bytes({a, c, d, e}));
            }
        }
    }
    CHECK(mismatches == 0);
    CHECK(checked > 1'000'000);
}

TEST_CASE("printable passes text through and escapes control and broken bytes") {
    using snug::printable;
    CHECK(printable("ab c\n~") == "ab c\n~");
    CHECK(printable("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80") == "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    CHECK(printable(bytes({'\t', '\r', 0x1b, '[', 0x7f, 0})) == "\\x09\\x0d\\x1b[\\x7f\\x00");
    CHECK(printable("\xe2\x82") == "\\xe2\\x82");                   // truncated at the end
    CHECK(printable("\xc3(") == "\\xc3(");                          // a lead without its continuation
    CHECK(printable("\xc0\xaf") == "\\xc0\\xaf");                   // overlong '/'
    CHECK(printable("\xed\xa0\x80") == "\\xed\\xa0\\x80");          // a surrogate
    CHECK(printable("\xf4\x90\x80\x80") == "\\xf4\\x90\\x80\\x80"); // past U+10FFFF
    CHECK(printable("\xc2\x9b" "1m") == "\\xc2\\x9b" "1m");         // C1 CSI
    CHECK(printable("\xc2\xa0") == "\xc2\xa0");                     // no-break space prints
    CHECK(printable("\x80\xff") == "\\x80\\xff");
}

TEST_CASE("a byte sample decodes prompt and continuation as one text") {
    const std::vector<std::int32_t> split_euro = {'a', 0xe2, 0x82, 0xac};
    CHECK(snug::render_tokens(split_euro, true, nullptr) == "a\xe2\x82\xac");
    CHECK(snug::render_tokens({1, 22, 333}, false, nullptr) == "1 22 333");
}

TEST_CASE("sample_token: greedy and top-1 take the largest logit, and top-k never leaves the k largest") {
    const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.9f, 0.0f};
    snug::Generator rng(7);
    CHECK(snug::sample_token(logits, 0.0f, 0, rng) == 1);
    for (int i = 0; i < 200; ++i) CHECK(snug::sample_token(logits, 5.0f, 1, rng) == 1);
    int seen[5] = {};
    for (int i = 0; i < 2000; ++i) ++seen[snug::sample_token(logits, 5.0f, 2, rng)];
    CHECK(seen[0] + seen[2] + seen[4] == 0);
    CHECK(seen[1] > 0);
    CHECK(seen[3] > 0);
}

TEST_CASE("sample_token draws softmax(logits / temperature) (frequencies within 5 standard deviations)") {
    const std::vector<float> logits = {0.0f, static_cast<float>(std::log(2.0)), static_cast<float>(std::log(4.0))};
    for (const float temperature : {1.0f, 0.5f}) {
        // p ∝ (1, 2, 4)^(1 / temperature)
        const double e = 1.0 / temperature;
        const double w[3] = {1.0, std::pow(2.0, e), std::pow(4.0, e)};
        const double sum = w[0] + w[1] + w[2];
        snug::Generator rng(2024);
        constexpr int draws = 40'000;
        int seen[3] = {};
        for (int i = 0; i < draws; ++i) ++seen[snug::sample_token(logits, temperature, 0, rng)];
        for (int k = 0; k < 3; ++k) {
            const double p = w[k] / sum;
            const double sd = std::sqrt(draws * p * (1 - p));
            INFO("temperature " << temperature << ", token " << k << ": " << seen[k] << " draws, expected "
                                << draws * p);
            CHECK(std::abs(seen[k] - draws * p) < 5 * sd);
        }
    }
}
