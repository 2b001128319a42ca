// The libFuzzer entry point of every fuzz executable: compiled once, linked
// into one executable per target with a one-line source that defines
// snug_fuzz_target_name (tests/fuzz/CMakeLists.txt generates it). It feeds each input
// to the target in targets.hpp and enforces the contract: the input loads, or
// the reader throws snug::Error naming the file; any other exception, an empty
// message or a message without the file is a finding (abort, so libFuzzer
// saves the input). Crashes, sanitizer reports, hangs and oversized
// allocations are libFuzzer's own findings (-timeout, -malloc_limit_mb).
// Half of the mutations understand the formats (mutator.hpp).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <typeinfo>

#include <cxxabi.h>
#include <unistd.h>

#include "fuzz/mutator.hpp"
#include "fuzz/targets.hpp"

// The target this executable fuzzes: a name from snug::fuzz::targets.
extern "C" const char snug_fuzz_target_name[];

namespace {

const snug::fuzz::Target& target() {
    static const snug::fuzz::Target* t = [] {
        const snug::fuzz::Target* found = snug::fuzz::find_target(snug_fuzz_target_name);
        if (found == nullptr) {
            std::fprintf(stderr, "snug fuzz: no target named '%s'\n", snug_fuzz_target_name);
            std::abort();
        }
        return found;
    }();
    return *t;
}

// This process's scratch directory, removed at exit.
const snug::fuzz::Scratch& scratch() {
    static const snug::fuzz::Scratch s(std::filesystem::temp_directory_path() /
                                       ("snug-fuzz-" + std::string(snug_fuzz_target_name) + "-" +
                                        std::to_string(::getpid())));
    static const bool cleanup = [] {
        std::atexit([] {
            std::error_code ec;
            std::filesystem::remove_all(scratch().dir(), ec);
        });
        return true;
    }();
    (void)cleanup;
    return s;
}

std::string type_name(const std::type_info& t) {
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(t.name(), nullptr, nullptr, &status), std::free);
    return status == 0 && name ? name.get() : t.name();
}

[[noreturn]] void finding(const std::string& what) {
    std::fprintf(stderr, "\n==snug-fuzz== FINDING in target %s: %s\n", snug_fuzz_target_name, what.c_str());
    std::fflush(stderr);
    std::abort();
}

// SNUG_FUZZ_VERBOSE=1 prints each input's outcome (loaded, or the error), for
// replaying a few inputs by hand: fuzz_<target> FILE...
bool verbose() {
    static const bool v = [] {
        const char* e = std::getenv("SNUG_FUZZ_VERBOSE");
        return e != nullptr && *e != '\0' && *e != '0';
    }();
    return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const snug::fuzz::Scratch& s = scratch();
    try {
        target().run(snug::fuzz::Bytes(data, size), s);
        if (verbose()) std::fprintf(stderr, "snug-fuzz: loaded\n");
    } catch (const snug::Error& e) {
        if (verbose()) std::fprintf(stderr, "snug-fuzz: %s: %s\n", type_name(typeid(e)).c_str(), e.what());
        try {
            snug::fuzz::check_error(e, s.dir());
        } catch (const snug::fuzz::ContractViolation& v) {
            finding(std::string(v.what()) + " [" + type_name(typeid(e)) + "]");
        }
    } catch (const snug::fuzz::ContractViolation& v) {
        finding(v.what());
    } catch (const std::exception& e) {
        finding("an exception that is not snug::Error escaped: " + type_name(typeid(e)) + ": " + e.what());
    } catch (...) {
        finding("an exception that is not a std::exception escaped");
    }
    return 0;
}

// libFuzzer's own mutations (byte flips, dictionary words, comparisons seen).
extern "C" std::size_t LLVMFuzzerMutate(std::uint8_t* data, std::size_t size, std::size_t max_size);

// Half of the mutations are structure-aware (mutator.hpp): a JSON value or an
// llm.c header field changed with the file rebuilt around it.
extern "C" std::size_t LLVMFuzzerCustomMutator(std::uint8_t* data, std::size_t size, std::size_t max_size,
                                               unsigned int seed) {
    if (seed % 2 == 0) {
        const auto out = snug::fuzz::mutate::structured(snug_fuzz_target_name, snug::fuzz::Bytes(data, size), seed / 2);
        if (out && !out->empty() && out->size() <= max_size) {
            std::memcpy(data, out->data(), out->size());
            return out->size();
        }
    }
    return LLVMFuzzerMutate(data, size, max_size);
}
