// Who this process is in a data-parallel run, and spawning local ranks.
#pragma once

#include "spmd/runtime/collectives.h"

#include <chrono>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace spmd {

// The rank set by torchrun (RANK, WORLD_SIZE, LOCAL_RANK), Slurm (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID) or Open MPI (OMPI_COMM_WORLD_RANK, _SIZE,
// _LOCAL_RANK), with MASTER_ADDR / MASTER_PORT; nullopt when none is set.
// Throws Diagnostic for malformed values.
std::optional<RankInfo> rankFromEnvironment();

// A TCP port on 127.0.0.1 that nothing listens on right now.
int freeLocalPort();

// Runs `argv` (this program's own arguments) as `nproc` local ranks, each
// with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set, and waits. When
// one rank fails, the others are stopped at once; the return value is 0 when
// all succeeded, else 1, with a line on `err` naming the rank.
int launchLocalRanks(const std::string& tool, int nproc, const std::vector<std::string>& argv, std::ostream& err);

}  // namespace spmd
