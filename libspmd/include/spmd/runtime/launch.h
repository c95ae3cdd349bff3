// Who this process is in a data-parallel run, and spawning local ranks.
#pragma once

#include "spmd/runtime/collectives.h"

#include <chrono>
#include <optional>
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
// with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set, and supervises
// them (supervisor.cpp says what it guarantees). Returns 0 when every rank
// succeeded; else 1, after printing the error lines of the rank that failed
// first and one summary line naming it.
int launchLocalRanks(const std::string& tool, int nproc, const std::vector<std::string>& argv);

// The exit code of a rank under launchLocalRanks whose failure follows a
// peer's (a collective or the join failed): the launcher then reports the
// peer. Elsewhere (torchrun, Slurm) such a rank exits 1, as every failure.
constexpr int kPeerFailureExit = 3;
int peerFailureExitCode();

}  // namespace spmd
