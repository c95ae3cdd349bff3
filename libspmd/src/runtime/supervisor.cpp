// launchLocalRanks: `spmd-run --nproc N` starts N ranks and supervises them.
//
// What it guarantees (README, "Faults"):
// - SIGTERM, SIGINT or SIGHUP to the launcher is passed on to every rank; a
//   rank still running after a grace period gets SIGKILL.
// - When a rank fails (an error, a signal, or stopped with SIGSTOP for more
//   than a moment), the others get SIGTERM at once and SIGKILL after the
//   grace, so the group ends within the ranks' --timeout plus the grace.
// - A rank dies with the launcher, even one killed with SIGKILL
//   (PR_SET_PDEATHSIG in each rank).
// - One report per failure: ranks write their error lines to a pipe of the
//   launcher (SPMD_ERROR_FD, see support/tool.h), not to stderr; the launcher
//   prints the lines of the rank that failed first, then one summary line.
//   A rank that failed only because a peer did (a collective or the join
//   failed) says so by its exit code (kPeerFailureExit), so that a peer's
//   own failure, seen a moment later, is still the one reported. A rank that
//   failed on its own ignores SIGTERM once it has reported (spmd-run's main),
//   so its exit code, not our signal, ends it.
//
// It does not watch for a rank that runs on but stops calling collectives:
// its peers' --timeout finds that one.
#include "spmd/runtime/launch.h"

#include "spmd/support/diagnostic.h"
#include "spmd/support/write_all.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace spmd {
namespace {

using Clock = std::chrono::steady_clock;

// From SIGTERM to SIGKILL: a rank that handles SIGTERM has this long to end.
constexpr auto kGrace = std::chrono::seconds(5);
// A rank stopped with SIGSTOP this long is taken for hung (a moment's stop,
// as a debugger or profiler makes, is not).
constexpr auto kStoppedTolerance = std::chrono::seconds(2);

// The signal handlers' only work: a byte on this self-pipe wakes poll().
int gWakeWrite = -1;

void onSignal(int sig) {
  const int saved = errno;
  const char c = static_cast<char>(sig);
  ssize_t ignored = ::write(gWakeWrite, &c, 1);
  (void)ignored;
  errno = saved;
}

std::string signalName(int sig) {
  const char* text = ::strsignal(sig);
  return "signal " + std::to_string(sig) + (text ? std::string(" (") + text + ")" : "");
}

// One local rank as the launcher sees it.
struct RankProcess {
  pid_t pid = -1;
  int errorFd = -1;    // read end of the rank's error pipe; -1 once at its end
  std::string errors;  // the lines the rank reported there
  bool running = false;
  int sentSignal = 0;   // the launcher's last signal to it: its death by that is no news
  bool killed = false;  // got SIGKILL from the launcher
  std::optional<Clock::time_point> stoppedSince;
};

// The failure the launcher reports: a rank's own failure wins over one that
// follows a peer's (kPeerFailureExit), whichever was seen first.
struct Failure {
  int rank = -1;
  std::string how;  // "exited with code 1", "was killed by signal 9 (Killed)", ...
  bool own = true;
};

class Supervisor {
 public:
  Supervisor(std::string tool, int nproc, const std::vector<std::string>& argv)
      : tool_(std::move(tool)), argv_(argv), ranks_(nproc) {}

  int run() {
    const int port = freeLocalPort();
    installSignalHandlers();
    try {
      for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) spawn(r, port);
    } catch (...) {  // no fork or pipe left: the ranks started go, as they would with us
      killRemaining();
      for (const auto& rank : ranks_) {
        if (rank.running) ::waitpid(rank.pid, nullptr, 0);
      }
      restoreSignalHandlers();
      throw;
    }
    while (anyRunning()) {
      waitForEvents();
      readWakeups();
      for (auto& rank : ranks_) readErrors(rank);
      reap();
      checkStopped();
      if (stopping_ && !killSent_ && Clock::now() >= killAt_) killRemaining();
    }
    for (auto& rank : ranks_) readErrors(rank);
    restoreSignalHandlers();
    return report();
  }

 private:
  void installSignalHandlers() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw Diagnostic("--nproc", std::string("cannot create a pipe: ") + std::strerror(errno));
    }
    wakeRead_ = fds[0];
    gWakeWrite = fds[1];
    struct sigaction sa {};
    sa.sa_handler = onSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // no SA_NOCLDSTOP: a stopped rank is news
    for (int sig : kHandled) {
      struct sigaction old {};
      ::sigaction(sig, &sa, &old);
      saved_.push_back(old);
    }
  }

  void restoreSignalHandlers() {
    for (size_t i = 0; i < saved_.size(); ++i) ::sigaction(kHandled[i], &saved_[i], nullptr);
    ::close(wakeRead_);
    ::close(gWakeWrite);
    gWakeWrite = -1;
  }

  // The environment of rank `r`: ours, with the rank's variables set.
  std::vector<std::string> rankEnvironment(int r, int port, int errorFd) const {
    static const std::vector<std::string> ours = {"RANK=", "LOCAL_RANK=", "WORLD_SIZE=", "MASTER_ADDR=",
                                                  "MASTER_PORT=", "SPMD_ERROR_FD="};
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      bool replaced = false;
      for (const auto& prefix : ours) replaced = replaced || entry.rfind(prefix, 0) == 0;
      if (!replaced) env.push_back(entry);
    }
    const std::string values[] = {std::to_string(r), std::to_string(r), std::to_string(ranks_.size()), "127.0.0.1",
                                  std::to_string(port), std::to_string(errorFd)};
    for (size_t i = 0; i < ours.size(); ++i) env.push_back(ours[i] + values[i]);
    return env;
  }

  void spawn(int r, int port) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      throw Diagnostic("--nproc", std::string("cannot create a pipe: ") + std::strerror(errno));
    }
    // Everything the child needs is built before fork: between fork and
    // exec only async-signal-safe calls.
    const std::vector<std::string> env = rankEnvironment(r, port, fds[1]);
    std::vector<char*> envp, args;
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    for (const auto& a : argv_) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const std::string cannotStart = tool_ + ": error: rank " + std::to_string(r) + ": cannot start\n";
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw Diagnostic("--nproc", std::string("cannot start a rank: ") + std::strerror(errno));
    if (pid == 0) {
      // Die with the launcher; if it is gone already, do not start.
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(127);
      ::fcntl(fds[1], F_SETFD, 0);  // the error pipe stays open across exec
      ::execve("/proc/self/exe", args.data(), envp.data());
      writeAll(fds[1], cannotStart.data(), cannotStart.size());
      ::_exit(127);
    }
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    ranks_[r].pid = pid;
    ranks_[r].errorFd = fds[0];
    ranks_[r].running = true;
  }

  bool anyRunning() const {
    for (const auto& rank : ranks_) {
      if (rank.running) return true;
    }
    return false;
  }

  // Sleeps until a signal, error text, or the next deadline.
  void waitForEvents() {
    std::vector<pollfd> fds = {{wakeRead_, POLLIN, 0}};
    for (const auto& rank : ranks_) {
      if (rank.errorFd >= 0) fds.push_back({rank.errorFd, POLLIN, 0});
    }
    // Stopped ranks and the kill deadline are checked at least this often.
    int timeoutMs = 200;
    ::poll(fds.data(), fds.size(), timeoutMs);
  }

  void readWakeups() {
    char buf[64];
    ssize_t n;
    while ((n = ::read(wakeRead_, buf, sizeof buf)) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] != SIGCHLD) interrupt(buf[i]);
      }
    }
  }

  // SIGTERM, SIGINT or SIGHUP to the launcher: passed on to the ranks; a
  // second one does not wait for the grace.
  void interrupt(int sig) {
    if (!interruptedBy_) interruptedBy_ = sig;
    if (stopping_) {
      killRemaining();
    } else {
      stop(sig);
    }
  }

  void readErrors(RankProcess& rank) {
    if (rank.errorFd < 0) return;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(rank.errorFd, buf, sizeof buf);
      if (n > 0) {
        // Bounded: a rank's report is a few lines.
        if (rank.errors.size() < (1u << 16)) rank.errors.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) {  // every writer gone
        ::close(rank.errorFd);
        rank.errorFd = -1;
      }
      return;
    }
  }

  // Every rank that ended is collected before any is judged: a rank killed
  // by someone else is not taken for one the launcher stopped because of a
  // peer reaped in the same round.
  void reap() {
    std::vector<std::pair<int, int>> endedRanks;  // rank, wait status
    for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
      RankProcess& rank = ranks_[r];
      if (!rank.running) continue;
      int status = 0;
      const pid_t pid = ::waitpid(rank.pid, &status, WNOHANG | WUNTRACED | WCONTINUED);
      if (pid != rank.pid) continue;
      if (WIFSTOPPED(status)) {
        // SIGTSTP, SIGTTIN, SIGTTOU: job control, which stops the launcher too.
        if (WSTOPSIG(status) == SIGSTOP) rank.stoppedSince = Clock::now();
        continue;
      }
      if (WIFCONTINUED(status)) {
        rank.stoppedSince.reset();
        continue;
      }
      rank.running = false;
      endedRanks.emplace_back(r, status);
    }
    for (const auto& [r, status] : endedRanks) ended(r, status);
  }

  void ended(int r, int status) {
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    // After an interrupt, or a death by the launcher's own signal, there is
    // nothing to report.
    if (interruptedBy_ || (WIFSIGNALED(status) && WTERMSIG(status) == ranks_[r].sentSignal)) return;
    Failure f;
    f.rank = r;
    if (WIFSIGNALED(status)) {
      f.how = "was killed by " + signalName(WTERMSIG(status));
    } else if (WEXITSTATUS(status) == kPeerFailureExit) {
      f.how = "lost a peer (its collective or its join failed)";
      f.own = false;
    } else {
      f.how = "exited with code " + std::to_string(WEXITSTATUS(status));
    }
    fail(f);
  }

  // A rank stopped with SIGSTOP for longer than a moment makes no progress:
  // its peers would wait for it until their --timeout.
  void checkStopped() {
    for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
      const RankProcess& rank = ranks_[r];
      if (!rank.running || !rank.stoppedSince || Clock::now() - *rank.stoppedSince < kStoppedTolerance) continue;
      if (stopping_) continue;  // SIGKILL at the deadline ends it
      fail({r, "was stopped (SIGSTOP) for " + std::to_string(kStoppedTolerance.count()) + " s, making no progress",
            true});
    }
  }

  void fail(const Failure& f) {
    const bool better = !failure_ || (f.own && !failure_->own);
    if (better) failure_ = f;
    if (!stopping_) stop(SIGTERM);
  }

  void stop(int sig) {
    stopping_ = true;
    killAt_ = Clock::now() + kGrace;
    for (auto& rank : ranks_) {
      if (!rank.running) continue;
      ::kill(rank.pid, sig);
      ::kill(rank.pid, SIGCONT);  // a stopped rank could not act on it
      rank.sentSignal = sig;
    }
  }

  void killRemaining() {
    killSent_ = true;
    for (auto& rank : ranks_) {
      if (!rank.running) continue;
      ::kill(rank.pid, SIGKILL);
      rank.sentSignal = SIGKILL;
      rank.killed = true;
    }
  }

  // The failing rank's lines as it wrote them, then one line of ours.
  int report() const {
    if (!failure_ && !interruptedBy_) return 0;
    std::string text;
    if (interruptedBy_ && !failure_) {
      text = tool_ + ": error: interrupted by " + signalName(interruptedBy_) + ": passed on to the " +
             std::to_string(ranks_.size()) + " ranks" + killedNote() + "\n";
    } else {
      text = ranks_[failure_->rank].errors;
      if (!text.empty() && text.back() != '\n') text += '\n';
      text += tool_ + ": error: rank " + std::to_string(failure_->rank) + " of " + std::to_string(ranks_.size()) +
              " failed first: it " + failure_->how + "; the other ranks were stopped" + killedNote() + "\n";
    }
    writeAll(STDERR_FILENO, text.data(), text.size());
    return 1;
  }

  // Which ranks needed SIGKILL: they did not end within the grace.
  std::string killedNote() const {
    std::string ranks;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (ranks_[r].killed) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    if (ranks.empty()) return "";
    return " (killed after a " + std::to_string(kGrace.count()) + " s grace: rank " + ranks + ")";
  }

  static constexpr int kHandled[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP};

  std::string tool_;
  std::vector<std::string> argv_;
  std::vector<RankProcess> ranks_;
  std::vector<struct sigaction> saved_;
  int wakeRead_ = -1;
  int interruptedBy_ = 0;
  bool stopping_ = false;
  bool killSent_ = false;
  Clock::time_point killAt_;
  std::optional<Failure> failure_;
};

}  // namespace

int launchLocalRanks(const std::string& tool, int nproc, const std::vector<std::string>& argv) {
  return Supervisor(tool, nproc, argv).run();
}

}  // namespace spmd
