// Test support: a fresh directory under the system's temporary directory,
// removed with everything in it when the object goes out of scope.
#pragma once

#include <filesystem>
#include <random>
#include <string>
#include <system_error>

namespace snug::test {

struct TempDir {
    std::filesystem::path path;

    explicit TempDir(const std::string& prefix = "snug-test-") {
        std::random_device rd;
        path = std::filesystem::temp_directory_path() / (prefix + std::to_string(rd()) + std::to_string(rd()));
        std::filesystem::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
};

}  // namespace snug::test
