// Catch2's main for the host test executables.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
