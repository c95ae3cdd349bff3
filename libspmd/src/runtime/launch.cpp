#include "spmd/runtime/launch.h"

#include "spmd/support/diagnostic.h"
#include "spmd/support/tool.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace spmd {
namespace {

// The most ranks a run takes from a launcher (--nproc's bound is 1024 local
// ranks); past it a typo, whose join would wait on a million ranks.
constexpr long kMaxWorldSize = 65536;

std::optional<int> envInt(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0 || errno == ERANGE || n > INT32_MAX) {
    throw Diagnostic(name, std::string("expected a number, got '") + v + "'");
  }
  return static_cast<int>(n);
}

// torchrun's variables, and a hand-made launch's: set some of RANK,
// WORLD_SIZE and LOCAL_RANK (or one empty) and a rank would train alone,
// exit 0, while its peers wait. Refused: a launcher sets RANK and
// WORLD_SIZE together. (MASTER_ADDR and MASTER_PORT alone are srun's and
// mpirun's, whose ranks come from their own variables.)
void checkTorchrunVariables() {
  const char* names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK"};
  std::string set;
  for (const char* n : names) {
    if (std::getenv(n)) set += std::string(set.empty() ? "" : ", ") + n;
  }
  if (set.empty()) return;
  for (const char* n : {"RANK", "WORLD_SIZE"}) {
    const char* v = std::getenv(n);
    if (!v || !*v) {
      throw Diagnostic(n, std::string(v ? "is empty" : "is not set") + " where the environment sets " + set +
                              ": a launcher sets RANK and WORLD_SIZE together (unset them to run alone or with --nproc)");
    }
  }
}

// MASTER_ADDR resolved now, so that a name nothing resolves fails at once,
// not after the store's retries.
void checkMasterAddress(const std::string& addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(addr.c_str(), nullptr, &hints, &found);
  if (rc != 0) throw Diagnostic("MASTER_ADDR", "cannot resolve '" + addr + "': " + ::gai_strerror(rc));
  ::freeaddrinfo(found);
}

}  // namespace

std::optional<RankInfo> rankFromEnvironment() {
  struct Scheme {
    const char* rank;
    const char* size;
    const char* local;
  };
  checkTorchrunVariables();
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
    if (info.worldSize > kMaxWorldSize) {
      throw Diagnostic(s.size, std::to_string(info.worldSize) + " ranks: at most " + std::to_string(kMaxWorldSize));
    }
    if (const char* addr = std::getenv("MASTER_ADDR"); addr && *addr) info.masterAddr = addr;
    info.masterPort = envInt("MASTER_PORT").value_or(29500);
    if (info.masterPort < 1 || info.masterPort > 65535) {
      throw Diagnostic("MASTER_PORT", "port " + std::to_string(info.masterPort) + " is not in 1-65535");
    }
    if (info.worldSize > 1) checkMasterAddress(info.masterAddr);
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
