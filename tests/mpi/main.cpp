// Catch2's main for the MPI tests: the test executable runs as every rank of
// `mpirun -np 2` (ctest starts it so); MPI starts before the first test and
// ends after the last. Each rank runs every test case and reports its own
// failures; mpirun fails the test when any rank does.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <memory>

#include "mpi/ranks_fixture.hpp"
#include "snug/dist/mpi.hpp"

namespace snug::test {
dist::Ranks* the_ranks = nullptr;
}

int main(int argc, char** argv) {
    if (!snug::dist::launched_by_mpi()) {
        std::fprintf(stderr, "snug_mpi_tests: run me under mpirun -np 2 (ctest does)\n");
        return 1;
    }
    auto ranks = std::make_unique<snug::dist::MpiRanks>(&argc, &argv);
    snug::test::the_ranks = ranks.get();
    ranks->set_timeout(120.0);
    return Catch::Session().run(argc, argv);
}
