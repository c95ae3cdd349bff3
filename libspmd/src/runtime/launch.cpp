#include "spmd/runtime/launch.h"

#include "spmd/support/diagnostic.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <thread>

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

int launchLocalRanks(const std::string& tool, int nproc, const std::vector<std::string>& argv, std::ostream& err) {
  const int port = freeLocalPort();
  std::vector<pid_t> pids(nproc, -1);
  for (int r = 0; r < nproc; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) throw Diagnostic("--nproc", std::string("cannot start a rank: ") + std::strerror(errno));
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv("/proc/self/exe", args.data());
      std::fprintf(stderr, "%s: error: rank %d: cannot start: %s\n", tool.c_str(), r, std::strerror(errno));
      ::_exit(127);
    }
    pids[r] = pid;
  }
  int running = nproc, failedRank = -1, failedStatus = 0;
  while (running > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) break;
    int rank = -1;
    for (int r = 0; r < nproc; ++r) {
      if (pids[r] == pid) rank = r;
    }
    if (rank < 0) continue;
    pids[rank] = -1;
    --running;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && failedRank < 0) {
      failedRank = rank;
      failedStatus = status;
      // One rank is gone: the others would only wait for it. Stop them now.
      for (pid_t other : pids) {
        if (other > 0) ::kill(other, SIGTERM);
      }
    }
  }
  if (failedRank < 0) return 0;
  if (WIFSIGNALED(failedStatus)) {
    err << tool << ": error: rank " << failedRank << " was killed by signal " << WTERMSIG(failedStatus)
        << "; the other ranks were stopped" << std::endl;
  } else {
    err << tool << ": error: rank " << failedRank << " exited with code " << WEXITSTATUS(failedStatus)
        << "; the other ranks were stopped" << std::endl;
  }
  return 1;
}

}  // namespace spmd
