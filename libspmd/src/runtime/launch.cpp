#include "spmd/runtime/launch.h"

#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace spmd {
namespace {

std::optional<int> envInt(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0) throw Diagnostic(name, std::string("expected a number, got '") + v + "'");
  return static_cast<int>(n);
}

}  // namespace

std::optional<RankInfo> rankFromEnvironment() {
  struct Scheme {
    const char* rank;
    const char* size;
    const char* local;
  };
  for (const Scheme& s : {Scheme{"RANK", "WORLD_SIZE", "LOCAL_RANK"}, Scheme{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
                          Scheme{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"}}) {
    auto rank = envInt(s.rank);
    auto size = envInt(s.size);
    if (!rank || !size) continue;
    RankInfo info;
    info.rank = *rank;
    info.worldSize = *size;
    info.localRank = envInt(s.local).value_or(*rank);
    if (info.worldSize < 1 || info.rank >= info.worldSize) {
      throw Diagnostic(s.rank, "rank " + std::to_string(info.rank) + " is not below world size " + std::to_string(info.worldSize));
    }
    if (const char* addr = std::getenv("MASTER_ADDR")) info.masterAddr = addr;
    info.masterPort = envInt("MASTER_PORT").value_or(29500);
    return info;
  }
  return std::nullopt;
}

int freeLocalPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw Diagnostic("--nproc", std::string("cannot find a free local port: ") + std::strerror(errno));
  }
  int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

int peerFailureExitCode() { return errorReportFd() == STDERR_FILENO ? 1 : kPeerFailureExit; }

}  // namespace spmd
