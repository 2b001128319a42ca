// The job's ranks, for the MPI tests (made in tests/mpi/main.cpp).
#pragma once

#include "snug/dist/ranks.hpp"

namespace snug::test {
extern dist::Ranks* the_ranks;
inline dist::Ranks& ranks() { return *the_ranks; }
}  // namespace snug::test
