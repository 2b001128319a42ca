// The synthetic corpus: its stated entropy rate against the empirical
// conditional entropy of a long sample (counted, not read from the corpus's
// tables), its window floor against counted first-order entropy, determinism,
// streams, the alphabet, and the per-state candidates.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/data/synthetic_corpus.hpp"

using snug::data::SyntheticCorpus;
using snug::data::SyntheticCorpusConfig;

namespace {

// -Σ w ln w in double, written out here rather than taken from the corpus.
double entropy_of(const std::vector<double>& w) {
    double h = 0.0;
    for (double p : w) h -= p * std::log(p);
    return h;
}

// Plug-in conditional entropy H(next | previous `order` tokens) of a sample,
// from transition counts, with the standard error of the mean of
// -ln p̂(next | context).
struct CountedEntropy {
    double h;
    double stderr_;
};

CountedEntropy counted_conditional_entropy(const std::vector<std::int32_t>& x, int order) {
    // Context = the previous `order` bytes packed into an int; 256 counters each.
    std::map<int, std::vector<std::int64_t>> counts;
    for (std::size_t t = static_cast<std::size_t>(order); t < x.size(); ++t) {
        int ctx = 0;
        for (int j = order; j >= 1; --j) ctx = ctx * 256 + x[t - static_cast<std::size_t>(j)];
        auto& row = counts[ctx];
        if (row.empty()) row.assign(256, 0);
        ++row[static_cast<std::size_t>(x[t])];
    }
    double sum = 0.0, sum2 = 0.0;
    std::int64_t n = 0;
    for (const auto& [ctx, next] : counts) {
        std::int64_t total = 0;
        for (std::int64_t k : next) total += k;
        for (std::int64_t k : next) {
            if (k == 0) continue;
            const double nll = -std::log(static_cast<double>(k) / static_cast<double>(total));
            sum += static_cast<double>(k) * nll;
            sum2 += static_cast<double>(k) * nll * nll;
            n += k;
        }
    }
    const double mean = sum / static_cast<double>(n);
    const double var = sum2 / static_cast<double>(n) - mean * mean;
    return {mean, std::sqrt(var / static_cast<double>(n))};
}

}  // namespace

TEST_CASE("the default corpus states H(w) as its entropy rate and a 256-token vocabulary") {
    const SyntheticCorpus corpus(SyntheticCorpusConfig{});
    const SyntheticCorpusConfig defaults;
    CHECK(corpus.entropy_rate() == Approx(entropy_of(defaults.weights)).epsilon(1e-14));
    CHECK(corpus.vocab_size() == 256);
    // The default weights {0.5, 0.25, 0.15, 0.1}: 1.2080 nats by hand.
    CHECK(corpus.entropy_rate() == Approx(0.5 * std::log(2.0) + 0.25 * std::log(4.0) +
                                          0.15 * std::log(1.0 / 0.15) + 0.1 * std::log(10.0)));
}

TEST_CASE("the counted conditional entropy of a long sample converges to entropy_rate()") {
    struct Case {
        int alphabet;
        std::vector<double> weights;
    };
    const Case cases[] = {
        {32, {0.5, 0.25, 0.15, 0.1}},
        {12, {0.3, 0.3, 0.2, 0.1, 0.05, 0.05}},
    };
    for (const Case& c : cases) {
        const SyntheticCorpus corpus(SyntheticCorpusConfig{2024, c.alphabet, c.weights});
        const std::vector<std::int32_t> x = corpus.generate(1'500'000, 3);
        const CountedEntropy e = counted_conditional_entropy(x, 2);
        // The plug-in estimate is biased low by about (K-1)·states / (2N).
        const double states = static_cast<double>(c.alphabet) * c.alphabet;
        const double bias = (static_cast<double>(c.weights.size()) - 1.0) * states / (2.0 * 1.5e6);
        INFO("alphabet " << c.alphabet << ": counted " << e.h << " ± " << e.stderr_ << ", stated "
                         << corpus.entropy_rate());
        CHECK(std::abs(e.h + bias - entropy_of(c.weights)) < 5.0 * e.stderr_ + bias);
        CHECK(std::abs(corpus.entropy_rate() - entropy_of(c.weights)) < 1e-12);
    }
}

TEST_CASE("every state's successors are K distinct symbols with the configured frequencies") {
    const std::vector<double> w = {0.4, 0.3, 0.2, 0.1};
    const int alphabet = 10;
    const SyntheticCorpus corpus(SyntheticCorpusConfig{77, alphabet, w});
    const std::vector<std::int32_t> x = corpus.generate(2'000'000, 0);
    std::map<std::pair<int, int>, std::map<int, std::int64_t>> next;
    for (std::size_t t = 2; t < x.size(); ++t) ++next[{x[t - 2], x[t - 1]}][x[t]];
    // Sorted by count, the successors of every visited state follow the
    // weights; pool them over states.
    std::vector<double> pooled(w.size(), 0.0);
    std::int64_t total = 0;
    for (const auto& [state, succ] : next) {
        CHECK(succ.size() <= w.size());
        std::vector<std::int64_t> counts;
        for (const auto& [c, k] : succ) counts.push_back(k);
        std::sort(counts.rbegin(), counts.rend());
        for (std::size_t i = 0; i < counts.size(); ++i) pooled[i] += static_cast<double>(counts[i]);
        for (auto k : counts) total += k;
    }
    for (std::size_t i = 0; i < w.size(); ++i) {
        const double f = pooled[i] / static_cast<double>(total);
        const double se = std::sqrt(w[i] * (1.0 - w[i]) / static_cast<double>(total));
        CHECK(std::abs(f - w[i]) < 5.0 * se + 1e-3);
    }
    // The candidate table itself: K distinct symbols in range per state.
    for (int s = 0; s < alphabet * alphabet; ++s) {
        std::set<int> seen;
        for (int i = 0; i < corpus.num_candidates(); ++i) {
            const int c = corpus.candidate(s, i);
            CHECK(c >= 0);
            CHECK(c < alphabet);
            seen.insert(c);
        }
        CHECK(seen.size() == w.size());
    }
}

TEST_CASE("the mean of -ln p(next | state) from the corpus's table matches the entropy rate") {
    const SyntheticCorpus corpus(SyntheticCorpusConfig{});
    const std::vector<std::int32_t> x = corpus.generate(400'000, 11);
    const int a = corpus.alphabet();
    // Map bytes back to symbol indices through the observed alphabet order.
    auto symbol = [&](std::int32_t byte) {
        for (int s = 0; s < a; ++s)
            if (SyntheticCorpus::character(s) == byte) return s;
        FAIL("byte " << byte << " is not in the alphabet");
        return -1;
    };
    double sum = 0.0, sum2 = 0.0;
    std::int64_t outside = 0;  // transitions to a non-candidate: a bug in generate
    for (std::size_t t = 2; t < x.size(); ++t) {
        const int state = symbol(x[t - 2]) * a + symbol(x[t - 1]);
        double p = 0.0;
        for (int i = 0; i < corpus.num_candidates(); ++i)
            if (corpus.candidate(state, i) == symbol(x[t])) p = corpus.probability(i);
        if (p == 0.0) {
            ++outside;
            continue;
        }
        sum += -std::log(p);
        sum2 += std::log(p) * std::log(p);
    }
    REQUIRE(outside == 0);
    const double n = static_cast<double>(x.size() - 2);
    const double mean = sum / n, se = std::sqrt((sum2 / n - mean * mean) / n);
    CHECK(std::abs(mean - corpus.entropy_rate()) < 5.0 * se);
}

TEST_CASE("window_floor mixes the one-token entropy of a window's first prediction with H(w)") {
    const SyntheticCorpus corpus(SyntheticCorpusConfig{});
    const std::vector<std::int32_t> x = corpus.generate(2'000'000, 5);
    const CountedEntropy h1 = counted_conditional_entropy(x, 1);
    INFO("counted H(X|prev) " << h1.h << " ± " << h1.stderr_ << ", stated " << corpus.entropy_given_one());
    CHECK(std::abs(h1.h - corpus.entropy_given_one()) < 5.0 * h1.stderr_ + 1e-3);
    CHECK(corpus.entropy_given_one() > corpus.entropy_rate());
    CHECK(corpus.entropy_given_one() <= std::log(static_cast<double>(corpus.alphabet())) + 1e-12);
    const double h = corpus.entropy_rate(), g = corpus.entropy_given_one();
    CHECK(corpus.window_floor(1) == Approx(g).epsilon(1e-12));
    CHECK(corpus.window_floor(64) == Approx((g + 63.0 * h) / 64.0).epsilon(1e-12));
    CHECK_THROWS_AS(corpus.window_floor(0), snug::ConfigError);
}

TEST_CASE("generation is deterministic in (seed, stream), and prefixes agree") {
    const SyntheticCorpus a(SyntheticCorpusConfig{}), b(SyntheticCorpusConfig{});
    const auto x = a.generate(5000, 9);
    CHECK(x == b.generate(5000, 9));
    const auto longer = a.generate(8000, 9);
    CHECK(std::equal(x.begin(), x.end(), longer.begin()));
    const auto other_stream = a.generate(5000, 10);
    const auto other_seed = SyntheticCorpus(SyntheticCorpusConfig{4242}).generate(5000, 9);
    auto differing = [&](const std::vector<std::int32_t>& y) {
        std::int64_t d = 0;
        for (std::size_t i = 0; i < x.size(); ++i) d += x[i] != y[i];
        return d;
    };
    CHECK(differing(other_stream) > 2500);
    CHECK(differing(other_seed) > 2500);
    CHECK(a.generate(0, 1).empty());
}

TEST_CASE("every token is a printable byte of the alphabet, and all of it is used") {
    for (int alphabet : {2, 32, 48}) {
        const SyntheticCorpus corpus(SyntheticCorpusConfig{5, alphabet, {0.6, 0.4}});
        const auto x = corpus.generate(200'000, 1);
        std::set<std::int32_t> distinct(x.begin(), x.end());
        CHECK(static_cast<int>(distinct.size()) == alphabet);
        for (std::int32_t t : distinct) {
            CHECK(t >= 32);
            CHECK(t < 127);
            CHECK(std::isprint(t));
        }
    }
}

TEST_CASE("a stream's first two tokens are uniform over the alphabet") {
    const SyntheticCorpus corpus(SyntheticCorpusConfig{});
    std::map<std::int32_t, int> first, second;
    const int streams = 32 * 400;
    for (int s = 0; s < streams; ++s) {
        const auto x = corpus.generate(2, static_cast<std::uint64_t>(s));
        ++first[x[0]];
        ++second[x[1]];
    }
    CHECK(first.size() == 32);
    CHECK(second.size() == 32);
    for (const auto& [t, k] : first) CHECK(std::abs(k - 400) < 5 * 20);  // sd = sqrt(400 * 31/32) ≈ 20
    for (const auto& [t, k] : second) CHECK(std::abs(k - 400) < 5 * 20);
}

TEST_CASE("bad corpus configurations are refused with the problem named") {
    using Catch::Matchers::Contains;
    CHECK_THROWS_WITH(SyntheticCorpus(SyntheticCorpusConfig{1, 1, {1.0}}), Contains("alphabet 1"));
    CHECK_THROWS_WITH(SyntheticCorpus(SyntheticCorpusConfig{1, 49, {1.0}}), Contains("alphabet 49"));
    CHECK_THROWS_WITH(SyntheticCorpus(SyntheticCorpusConfig{1, 3, {0.25, 0.25, 0.25, 0.25}}),
                      Contains("4 weights for an alphabet of 3"));
    CHECK_THROWS_WITH(SyntheticCorpus(SyntheticCorpusConfig{1, 8, {}}), Contains("0 weights"));
    CHECK_THROWS_WITH(SyntheticCorpus(SyntheticCorpusConfig{1, 8, {0.5, 0.6}}), Contains("sum to"));
    CHECK_THROWS_WITH(SyntheticCorpus(SyntheticCorpusConfig{1, 8, {1.5, -0.5}}), Contains("not positive"));
    CHECK_THROWS_AS(SyntheticCorpus(SyntheticCorpusConfig{}).generate(-1, 0), snug::ConfigError);
}
