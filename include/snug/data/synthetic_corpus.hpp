// The built-in corpus: a seeded synthetic language whose entropy rate is known
// exactly, so a trainer can print validation loss next to the floor no model
// can beat.
//
// The source is an order-2 Markov chain over `alphabet` printable characters.
// For every state (previous two symbols) the seed picks K distinct candidate
// symbols in a random order, and the next symbol is candidate k with
// probability weights[k]; the weights are the same for every state. Whatever
// the state, the next symbol's distribution is a permutation of the weights,
// so H(X_t | X_{t-1}, X_{t-2}) = H(w) = -Σ w_k ln w_k for every t >= 2 and
// the entropy rate is exactly H(w) nats per token, independent of the
// stationary distribution.
//
// Finite samples: the first two tokens of a stream are uniform over the
// alphabet, so a stream of n tokens holds 2 ln(A) + (n - 2) H(w) nats in total.
// A model that sees windows of T tokens cannot know the state for the first
// prediction of each window (it sees one token only); window_floor(T) is the
// exact floor for that setting, computed from the chain's stationary
// distribution.
//
// Tokens are byte values (vocab 256), so a sample prints as text.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/core/rng.hpp"

namespace snug::data {

// The characters the synthetic language draws from; `alphabet` takes a prefix.
inline constexpr std::string_view synthetic_characters = "abcdefghijklmnopqrstuvwxyz .,;:!?'-0123456789()\"";

struct SyntheticCorpusConfig {
    std::uint64_t seed = 1337;
    // How many characters of synthetic_characters the language uses, 2..48.
    int alphabet = 32;
    // Probabilities of the K candidates of every state (K <= alphabet, each > 0,
    // summing to 1 within 1e-9). The default has H(w) = 1.2080 nats.
    std::vector<double> weights = {0.5, 0.25, 0.15, 0.1};
};

class SyntheticCorpus {
public:
    explicit SyntheticCorpus(SyntheticCorpusConfig config) : config_(std::move(config)) {
        const int a = config_.alphabet;
        if (a < 2 || a > static_cast<int>(synthetic_characters.size()))
            throw ConfigError("synthetic corpus: alphabet " + std::to_string(a) + " is outside 2.." +
                              std::to_string(synthetic_characters.size()));
        const int k = static_cast<int>(config_.weights.size());
        if (k < 1 || k > a)
            throw ConfigError("synthetic corpus: " + std::to_string(k) + " weights for an alphabet of " +
                              std::to_string(a) + " (need 1..alphabet)");
        double sum = 0.0;
        for (double w : config_.weights) {
            if (!(w > 0.0) || !std::isfinite(w))
                throw ConfigError("synthetic corpus: weight " + std::to_string(w) + " is not positive");
            sum += w;
        }
        if (std::abs(sum - 1.0) > 1e-9)
            throw ConfigError("synthetic corpus: weights sum to " + std::to_string(sum) + ", not 1");
        cumulative_.resize(static_cast<std::size_t>(k));
        double c = 0.0;
        for (int i = 0; i < k; ++i) {
            c += config_.weights[static_cast<std::size_t>(i)] / sum;
            cumulative_[static_cast<std::size_t>(i)] = c;
        }
        cumulative_.back() = 1.0;
        entropy_ = 0.0;
        for (int i = 0; i < k; ++i) {
            const double w = probability(i);
            entropy_ -= w * std::log(w);
        }
        // Candidate table: for each state a*A + b, K distinct symbols by a
        // partial Fisher-Yates shuffle (random order, so which symbol gets
        // weights[0] is random too). Its own key, apart from the streams'.
        Generator g(config_.seed ^ 0x9E3779B97F4A7C15ull, 0);
        candidates_.resize(static_cast<std::size_t>(a) * a * k);
        std::vector<std::uint8_t> perm(static_cast<std::size_t>(a));
        for (int s = 0; s < a * a; ++s) {
            for (int i = 0; i < a; ++i) perm[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i);
            for (int i = 0; i < k; ++i) {
                const int j = i + static_cast<int>(g.below(static_cast<std::uint32_t>(a - i)));
                std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(j)]);
                candidates_[static_cast<std::size_t>(s) * k + i] = perm[static_cast<std::size_t>(i)];
            }
        }
    }

    // H(w) in nats per token: the loss floor for a model that sees the two
    // previous tokens.
    double entropy_rate() const { return entropy_; }

    // The exact mean loss floor over the T predictions of a window of T + 1
    // tokens drawn from the stationary chain: the first prediction sees one
    // token (H(X_t | X_{t-1})), the other T - 1 see two or more (H(w)).
    double window_floor(int T) const {
        if (T < 1) throw ConfigError("synthetic corpus: window length " + std::to_string(T) + " < 1");
        return (entropy_given_one() + (T - 1) * entropy_) / T;
    }

    // H(X_t | X_{t-1}) under the stationary distribution of the pair chain
    // (the limit of the lazy chain started, like a stream, from uniform pairs).
    double entropy_given_one() const {
        const int a = config_.alphabet, k = num_candidates();
        const std::vector<double> pi = stationary_pairs();
        // joint[b][c] = P(X_{t-1} = b, X_t = c).
        std::vector<double> joint(static_cast<std::size_t>(a) * a, 0.0);
        for (int s = 0; s < a * a; ++s) {
            const int b = s % a;
            for (int i = 0; i < k; ++i)
                joint[static_cast<std::size_t>(b) * a + candidate(s, i)] +=
                    pi[static_cast<std::size_t>(s)] * probability(i);
        }
        double h = 0.0;
        for (int b = 0; b < a; ++b) {
            double pb = 0.0;
            for (int c = 0; c < a; ++c) pb += joint[static_cast<std::size_t>(b) * a + c];
            for (int c = 0; c < a; ++c) {
                const double p = joint[static_cast<std::size_t>(b) * a + c];
                if (p > 0.0) h -= p * std::log(p / pb);
            }
        }
        return h;
    }

    // n tokens (byte values), deterministic in (seed, stream); different
    // streams are independent samples of the same language.
    std::vector<std::int32_t> generate(std::int64_t n, std::uint64_t stream) const {
        if (n < 0) throw ConfigError("synthetic corpus: cannot generate " + std::to_string(n) + " tokens");
        const int a = config_.alphabet;
        Generator g(config_.seed, stream);
        std::vector<std::int32_t> out(static_cast<std::size_t>(n));
        int prev2 = 0, prev1 = 0;
        for (std::int64_t t = 0; t < n; ++t) {
            int sym;
            if (t < 2) {
                sym = static_cast<int>(g.below(static_cast<std::uint32_t>(a)));
            } else {
                sym = candidate(prev2 * a + prev1, pick(g));
            }
            out[static_cast<std::size_t>(t)] = character(sym);
            prev2 = prev1;
            prev1 = sym;
        }
        return out;
    }

    // Tokens are bytes.
    int vocab_size() const { return 256; }
    int alphabet() const { return config_.alphabet; }
    int num_candidates() const { return static_cast<int>(cumulative_.size()); }
    const SyntheticCorpusConfig& config() const { return config_; }

    // Symbol index (0..alphabet-1) of candidate i of state (prev2, prev1),
    // state = prev2 * alphabet + prev1.
    int candidate(int state, int i) const {
        return candidates_[static_cast<std::size_t>(state) * num_candidates() + i];
    }
    // The normalised probability of candidate i.
    double probability(int i) const {
        return i == 0 ? cumulative_[0]
                      : cumulative_[static_cast<std::size_t>(i)] - cumulative_[static_cast<std::size_t>(i) - 1];
    }
    // Byte value of symbol index `sym`.
    static std::int32_t character(int sym) {
        return static_cast<unsigned char>(synthetic_characters[static_cast<std::size_t>(sym)]);
    }

private:
    // A candidate index with probability weights[i]: a 53-bit uniform against
    // the cumulative weights, so the probabilities are exact to double precision.
    int pick(Generator& g) const {
        const std::uint64_t hi = g.next_u32() >> 5, lo = g.next_u32() >> 6;  // 27 + 26 bits
        const double u = static_cast<double>((hi << 26) | lo) * (1.0 / 9007199254740992.0);
        int i = 0;
        while (i + 1 < num_candidates() && u >= cumulative_[static_cast<std::size_t>(i)]) ++i;
        return i;
    }

    std::vector<double> stationary_pairs() const {
        const int a = config_.alphabet, k = num_candidates(), states = a * a;
        std::vector<double> pi(static_cast<std::size_t>(states), 1.0 / states), next(pi.size());
        // The lazy chain (P + I) / 2 has the same stationary distribution and
        // is aperiodic, so the iteration converges.
        for (int iter = 0; iter < 100000; ++iter) {
            for (int s = 0; s < states; ++s) next[static_cast<std::size_t>(s)] = 0.5 * pi[static_cast<std::size_t>(s)];
            for (int s = 0; s < states; ++s) {
                const int b = s % a;
                for (int i = 0; i < k; ++i)
                    next[static_cast<std::size_t>(b * a + candidate(s, i))] +=
                        0.5 * pi[static_cast<std::size_t>(s)] * probability(i);
            }
            double diff = 0.0;
            for (int s = 0; s < states; ++s)
                diff += std::abs(next[static_cast<std::size_t>(s)] - pi[static_cast<std::size_t>(s)]);
            pi.swap(next);
            if (diff < 1e-14) break;
        }
        return pi;
    }

    SyntheticCorpusConfig config_;
    std::vector<double> cumulative_;
    std::vector<std::uint8_t> candidates_;  // (alphabet * alphabet, K) symbol indices
    double entropy_ = 0.0;
};

}  // namespace snug::data
