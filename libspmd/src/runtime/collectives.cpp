#include "spmd/runtime/collectives.h"

#include "spmd/ops/op_traits.h"
#include "spmd/runtime/errors.h"
#include "spmd/support/diagnostic.h"

#include <ATen/ATen.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
// pip's LibTorch ships no Gloo headers (Debian's does): Gloo only where they are.
#if __has_include(<gloo/algorithm.h>)
#define SPMD_HAVE_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef SPMD_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

// Some LibTorch builds log through glog; others (Debian's 2.6, pip's) through
// c10's own logging.
#if defined(C10_USE_GLOG) && __has_include(<glog/logging.h>)
#include <glog/logging.h>
#define SPMD_HAVE_GLOG 1
#endif

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <thread>
#include <type_traits>

namespace spmd {

namespace {

std::string firstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// Called in a catch block around process-group work: c10d's and Gloo's
// errors (a peer gone, a timeout, a reset connection) leave as
// CollectiveError, without LibTorch's C++ trace. spmd's own logic errors
// pass through.
[[noreturn]] void rethrowAsCollectiveError() {
  try {
    throw;
  } catch (const std::logic_error&) {
    throw;
  } catch (const c10::Error& e) {
    throw CollectiveError(firstLine(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw CollectiveError(firstLine(e.what()));
  }
}

// DDP's averaging: every rank divides by the world size, then the group sums.
template <typename Group>
class GroupCollectives : public Collectives {
 public:
  GroupCollectives(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<Group> group, int worldSize)
      : store_(std::move(store)), group_(std::move(group)), worldSize_(worldSize) {}

  std::vector<at::Tensor> run(const Node& node, const std::vector<at::Tensor>& tensors, bool mayReuseInput) override {
    try {
      return runNode(node, tensors, mayReuseInput);
    } catch (...) {
      rethrowAsCollectiveError();
    }
  }

  void shutdown() override {
#ifdef SPMD_WITH_CUDA
    if constexpr (std::is_same_v<Group, c10d::ProcessGroupNCCL>) {
      try {
        group_->shutdown();
      } catch (...) {
        rethrowAsCollectiveError();
      }
    }
#endif
  }

 private:
  std::vector<at::Tensor> runNode(const Node& node, const std::vector<at::Tensor>& tensors, bool mayReuseInput) {
    switch (collectiveKind(node.op)) {
      case CollectiveKind::Broadcast: {
        std::vector<at::Tensor> t = {mayReuseInput ? tensors.at(0) : tensors.at(0).clone()};
        c10d::BroadcastOptions opts;
        opts.rootRank = node.args.at(1).i;
        group_->broadcast(t, opts)->wait();
        return t;
      }
      case CollectiveKind::AllReduce: {
        const std::string& reduce = node.args.at(1).s;
        std::vector<at::Tensor> t = {prepared(tensors.at(0), reduce, mayReuseInput)};
        c10d::AllreduceOptions opts;
        if (reduce == "max") opts.reduceOp = c10d::ReduceOp::MAX;
        group_->allreduce(t, opts)->wait();
        return t;
      }
      case CollectiveKind::ReduceScatter: {
        // In flight like a bucket's all-reduce; spmd::bucket_wait takes it.
        at::Tensor flat = prepared(tensors.at(0), node.args.at(1).s, mayReuseInput).contiguous();
        at::Tensor shard = at::empty({flat.size(0) / worldSize_}, flat.options());
        inFlight_[node.args.back().i] = {group_->_reduce_scatter_base(shard, flat), shard};
        return {shard};
      }
      case CollectiveKind::AllGather: {
        auto gather = startAllGather(tensors.at(0));
        gather.first->wait();
        return {gather.second};
      }
      case CollectiveKind::GatherStart: {
        auto gather = startAllGather(tensors.at(0));
        gathers_[node.args.back().i] = gather;
        return {gather.second};
      }
      case CollectiveKind::GatherWait: {
        auto it = gathers_.find(node.args.back().i);
        if (it == gathers_.end()) throw std::logic_error("gather_wait without gather_start");
        it->second.first->wait();
        at::Tensor full = it->second.second;
        gathers_.erase(it);
        return {full};
      }
      case CollectiveKind::Shard: {
        const at::Tensor& whole = tensors.at(0);
        const int64_t rows = whole.size(0) / worldSize_;
        return {whole.narrow(0, rows * group_->getRank(), rows).clone()};
      }
      case CollectiveKind::BucketStart: {
        std::vector<at::Tensor> t = {prepared(tensors.at(0), node.args.at(1).s, mayReuseInput)};
        inFlight_[node.args.back().i] = {group_->allreduce(t), t[0]};
        return t;
      }
      case CollectiveKind::BucketWait: {
        auto it = inFlight_.find(node.args.back().i);
        if (it == inFlight_.end()) throw std::logic_error("bucket_wait without bucket_start");
        it->second.first->wait();
        at::Tensor reduced = it->second.second;
        inFlight_.erase(it);
        return {reduced};
      }
      case CollectiveKind::None: break;
    }
    throw std::logic_error("not a collective: " + node.qualifiedName());
  }

  // Launches the all-gather of every rank's flat `shard`, in rank order,
  // into a tensor of world size times its elements; returns the work and it.
  std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor> startAllGather(const at::Tensor& shard) {
    at::Tensor local = shard.contiguous();
    at::Tensor full = at::empty({local.size(0) * worldSize_}, local.options());
    return {group_->_allgather_base(full, local), full};
  }

  // The tensor the group reduces in place: the input itself when it may be
  // reused, else a copy; divided first for a mean (one pass either way).
  // A reduce-scatter reads it only, but the rows must be contiguous.
  at::Tensor prepared(const at::Tensor& t, const std::string& reduce, bool mayReuseInput) {
    if (reduce == "mean") return mayReuseInput ? t.div_(worldSize_) : t.div(worldSize_);
    return mayReuseInput ? t : t.clone();
  }

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Group> group_;
  int worldSize_;
  std::map<int64_t, std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>> inFlight_;
  // --shard parameters' gathers, by bucket: a bucket's may be in flight
  // while its reduce-scatter is (another iteration's, moved by spmd-unroll).
  std::map<int64_t, std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>> gathers_;
};

// Rank 0 serves the store: a port something else holds is reported as such,
// before c10d's own (noisy) attempt.
void requirePortFree(const RankInfo& info) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(info.masterPort));
  const bool busy = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 && errno == EADDRINUSE;
  ::close(fd);
  if (busy) {
    throw Diagnostic("MASTER_PORT " + std::to_string(info.masterPort), "the port is busy; choose another MASTER_PORT");
  }
}

std::string secondsText(std::chrono::milliseconds t) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", static_cast<double>(t.count()) / 1000);
  return text;
}

// c10d logs a store that does not answer (at ERROR) and a wait that timed
// out (at WARNING) before it throws; the one-line error spmd-run reports
// says the same. Quiet while joining only.
class QuietConnectLogs {
 public:
#ifdef SPMD_HAVE_GLOG
  QuietConnectLogs() : saved_(FLAGS_minloglevel) { FLAGS_minloglevel = google::GLOG_FATAL; }
  ~QuietConnectLogs() { FLAGS_minloglevel = saved_; }
#else
  // c10's own logging (LibTorch built without glog: Debian's 2.6, pip's).
  QuietConnectLogs() : saved_(FLAGS_caffe2_log_level) { FLAGS_caffe2_log_level = c10::GLOG_FATAL; }
  ~QuietConnectLogs() { FLAGS_caffe2_log_level = saved_; }
#endif
  QuietConnectLogs(const QuietConnectLogs&) = delete;
  QuietConnectLogs& operator=(const QuietConnectLogs&) = delete;

 private:
  int saved_;
};

std::string joinedKey(int rank) { return "spmd/joined/" + std::to_string(rank); }
const char* const kJoinedCountKey = "spmd/joined_count";

// The ranks a join error names, the first missing ones, and how many of the
// others it asks the store about to find them (a world of thousands).
constexpr size_t kNamedMissingRanks = 8;
constexpr int kMissingRanksAsked = 4096;

// "rank 3 of 4" or "5 ranks of 4096 (1, 7, 9, ... among them)", for the ranks
// from `first` (which did not join) on.
std::string missingRanks(c10d::Store& store, const RankInfo& info, int first) {
  const int64_t joined = store.add(kJoinedCountKey, 0);
  const int64_t count = std::max<int64_t>(1, info.worldSize - joined);
  const std::string of = " of " + std::to_string(info.worldSize);
  if (count == 1) return "rank " + std::to_string(first) + of;
  std::vector<int> named = {first};
  for (int m = first + 1; m < info.worldSize && m <= first + kMissingRanksAsked && named.size() < kNamedMissingRanks; ++m) {
    if (!store.check({joinedKey(m)})) named.push_back(m);
  }
  std::string list;
  for (int m : named) list += (list.empty() ? "" : ", ") + std::to_string(m);
  if (static_cast<int64_t>(named.size()) == count) return "ranks " + list + of;
  return std::to_string(count) + " ranks" + of + " (" + list + ", ... among them)";
}

void markJoined(c10d::Store& store, const RankInfo& info) {
  store.set(joinedKey(info.rank), std::vector<uint8_t>{1});
  store.add(kJoinedCountKey, 1);
}

// Every rank marks itself joined (markJoined), then waits for the others'
// marks: one deadline for the whole join, and the ranks that did not come
// are named. (c10d's waitWorkers names none, and its time adds to the
// process group's.)
void waitForPeers(c10d::Store& store, const RankInfo& info, std::chrono::milliseconds timeout,
                  const std::string& where) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 0; r < info.worldSize; ++r) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      store.wait({joinedKey(r)}, std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception&) {
      throw JoinError(where, missingRanks(store, info, r) + " did not join within " + secondsText(timeout));
    }
  }
}

// LibTorch's store asks for its libuv server by default (from 2.4), which a
// LibTorch built without libuv (Debian's) refuses at construction, before it
// opens a socket. The classic server speaks the same protocol to clients, so
// such a build gets that one. USE_LIBUV=0 asks for the classic one, as it does
// of PyTorch's own store. The flag picks the server only: clients never ask.
bool libuvRefused(const std::exception& e) { return std::string(e.what()).find("libuv") != std::string::npos; }

c10::intrusive_ptr<c10d::Store> openStore(const std::string& host, c10d::TCPStoreOptions opts) {
  const char* useLibuv = std::getenv("USE_LIBUV");
  opts.useLibUV = opts.isServer && !(useLibuv && std::string(useLibuv) == "0");
  if (opts.useLibUV) {
    try {
      return c10::make_intrusive<c10d::TCPStore>(host, opts);
    } catch (const std::exception& e) {
      if (!libuvRefused(e)) throw;
      opts.useLibUV = false;
    }
  }
  return c10::make_intrusive<c10d::TCPStore>(host, opts);
}

// Whether a TCP connection to `address` opens within `wait`.
bool accepts(const addrinfo& address, std::chrono::milliseconds wait) {
  const int fd = ::socket(address.ai_family, address.ai_socktype | SOCK_NONBLOCK, address.ai_protocol);
  if (fd < 0) return false;
  bool open = ::connect(fd, address.ai_addr, address.ai_addrlen) == 0;
  if (!open && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int error = 0;
    socklen_t size = sizeof error;
    open = ::poll(&p, 1, static_cast<int>(wait.count())) == 1 &&
           ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0;
  }
  ::close(fd);
  return open;
}

// Waits until rank 0's store accepts connections, or the deadline passes.
// LibTorch's client keeps retrying well past its timeout (about twice it,
// measured on 2.6), so a rank whose rank 0 never comes waits here instead,
// to the deadline it was given.
bool storeAnswers(const RankInfo& info, std::chrono::steady_clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(info.masterPort);
  if (::getaddrinfo(info.masterAddr.c_str(), port.c_str(), &hints, &found) != 0) return true;  // c10d says why
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, ::freeaddrinfo);
  for (;;) {
    for (const addrinfo* a = addresses.get(); a; a = a->ai_next) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (accepts(*a, std::clamp(left, std::chrono::milliseconds(1), std::chrono::milliseconds(1000)))) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The job this rank belongs to, as its launcher names it (the same in every
// rank of a job): spmd's own SPMD_RUN_ID, torchrun's --rdzv-id, Slurm's job
// and step, Open MPI's PMIx namespace; "" where none is set.
std::string jobIdentity() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  if (!env("SPMD_RUN_ID").empty()) return "SPMD_RUN_ID=" + env("SPMD_RUN_ID");
  const std::string elastic = env("TORCHELASTIC_RUN_ID");
  if (!elastic.empty() && elastic != "none") return "TORCHELASTIC_RUN_ID=" + elastic;  // torchrun's default is "none"
  if (!env("SLURM_JOB_ID").empty()) return "SLURM_JOB_ID=" + env("SLURM_JOB_ID") + "." + env("SLURM_STEP_ID");
  if (!env("PMIX_NAMESPACE").empty()) return "PMIX_NAMESPACE=" + env("PMIX_NAMESPACE");
  return "";
}

constexpr const char* kJobKey = "spmd/job";

// Rank 0 writes its job into the store; every other rank reads it before it
// joins, so that a rank given another job's MASTER_PORT (whose store
// answers, and whose ranks have joined) says so at once instead of joining
// a group that is not its own.
void requireOwnJob(c10d::Store& store, const RankInfo& info, std::chrono::milliseconds timeout,
                   const std::string& where) {
  const std::string mine = jobIdentity();
  if (info.rank == 0) {
    store.set(kJobKey, std::vector<uint8_t>(mine.begin(), mine.end()));
    return;
  }
  try {
    store.wait({kJobKey}, timeout);
  } catch (const std::exception&) {
    throw JoinError(where, "the store there did not say which job it serves within " + secondsText(timeout) +
                               ": is it another program's port?");
  }
  const std::vector<uint8_t> bytes = store.get(kJobKey);
  const std::string theirs(bytes.begin(), bytes.end());
  if (!mine.empty() && theirs != mine) {
    throw JoinError(where, "the store there serves another job (" + (theirs.empty() ? "unnamed" : theirs) +
                               "; this rank's is " + mine + "): give each job its own MASTER_PORT");
  }
}

std::string agreedKey(int rank) { return "spmd/agreed/" + std::to_string(rank); }

std::string encodeAgreement(const RunAgreement& agreed) {
  std::string text;
  for (const auto& [name, value] : agreed) text += name + '\n' + value + '\n';
  return text;
}

RunAgreement decodeAgreement(const std::vector<uint8_t>& bytes) {
  RunAgreement agreed;
  std::string text(bytes.begin(), bytes.end()), line[2];
  size_t at = 0;
  for (int k = 0; at < text.size(); k ^= 1) {
    const size_t end = text.find('\n', at);
    line[k] = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? text.size() : end + 1;
    if (k == 1) agreed.emplace_back(line[0], line[1]);
  }
  return agreed;
}

// Rank `theirs`' agreement against this rank's: throws naming the first
// thing that differs and both ranks' values.
void requireAgrees(const RunAgreement& mine, int me, const RunAgreement& other, int theirs, const std::string& where) {
  for (size_t k = 0; k < std::max(mine.size(), other.size()); ++k) {
    const std::string name = k < mine.size() ? mine[k].first : other[k].first;
    const std::string a = k < mine.size() ? mine[k].second : "(none)", b = k < other.size() ? other[k].second : "(none)";
    if ((k < mine.size() && k < other.size() && mine[k].first != other[k].first) || a != b) {
      throw Diagnostic(where, "rank " + std::to_string(theirs) + " runs a different step from rank " + std::to_string(me) +
                                  ": " + name + " " + b + " there, " + a + " here; every rank must run the same "
                                  "artifact with the same flags");
    }
  }
}

// Rank 0's agreement, which it presents as soon as it serves the store.
RunAgreement leadAgreement(c10d::Store& store, std::chrono::milliseconds timeout, const std::string& where) {
  try {
    store.wait({agreedKey(0)}, timeout);
  } catch (const std::exception&) {
    throw JoinError(where, "rank 0 did not present its step within " + secondsText(timeout));
  }
  return decodeAgreement(store.get(agreedKey(0)));
}

// The join, each rank presenting `agreed`: another rank holds rank 0's
// against its own before it marks itself joined, and reports a difference
// at once (rank 0 may be gone by the time it would ask again); rank 0,
// once every rank has joined, holds every rank's against its own.
void joinAgreeing(c10d::Store& store, const RankInfo& info, const RunAgreement& agreed,
                  std::chrono::milliseconds timeout, const std::string& where) {
  const std::string text = encodeAgreement(agreed);
  store.set(agreedKey(info.rank), std::vector<uint8_t>(text.begin(), text.end()));
  std::optional<RunAgreement> lead;
  if (info.rank != 0) lead = leadAgreement(store, timeout, where);
  auto requireAgreesWithLead = [&] {
    if (lead) requireAgrees(agreed, info.rank, *lead, 0, where);
  };
  try {
    markJoined(store, info);  // so that rank 0 gets to compare, and names the difference too
  } catch (const std::exception&) {
    // Rank 0 may have seen the difference first and left, its store with it,
    // before this add was answered: this rank names the difference all the same.
    requireAgreesWithLead();
    throw;
  }
  requireAgreesWithLead();
  waitForPeers(store, info, timeout, where);
  if (info.rank != 0) return;
  for (int r = 1; r < info.worldSize; ++r) requireAgrees(agreed, 0, decodeAgreement(store.get(agreedKey(r))), r, where);
}

// torchrun's agent serves the store at MASTER_ADDR:MASTER_PORT itself and
// says so (TORCHELASTIC_USE_AGENT_STORE=True): then every rank is a client,
// rank 0 too, and the keys go under the restart's prefix, as torch's own
// env:// initialisation does, so that a restarted group starts afresh. The
// prefix, or "" when the ranks serve their own store.
std::string agentStorePrefix() {
  const char* use = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  if (!use || std::string(use) != "True") return "";
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return "/worker/attempt_" + std::string(restart && *restart ? restart : "0");
}

c10::intrusive_ptr<c10d::Store> connect(const RankInfo& info, std::chrono::milliseconds timeout,
                                        const RunAgreement& agreed) {
  const std::string where = "MASTER_ADDR:MASTER_PORT " + info.masterAddr + ":" + std::to_string(info.masterPort);
  const std::string agentPrefix = agentStorePrefix();
  const bool serves = info.rank == 0 && agentPrefix.empty();
  if (serves) requirePortFree(info);
  if (!serves && !storeAnswers(info, std::chrono::steady_clock::now() + timeout)) {
    throw JoinError(where, (agentPrefix.empty() ? "rank 0's" : "torchrun's agent's") + std::string(" store did not answer within ") +
                               secondsText(timeout));
  }
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(info.masterPort);
  opts.isServer = serves;
  opts.numWorkers = static_cast<size_t>(info.worldSize);
  opts.waitWorkers = false;  // waitForPeers waits, and names who is missing
  opts.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  QuietConnectLogs quiet;
  try {
    store = openStore(info.masterAddr, opts);
  } catch (const std::exception& e) {
    if (serves) throw Diagnostic(where, "cannot serve the group's store: " + firstLine(e.what()));
    throw JoinError(where, "rank 0's store did not answer within " + secondsText(timeout) + ": " + firstLine(e.what()));
  }
  if (!agentPrefix.empty()) store = c10::make_intrusive<c10d::PrefixStore>(agentPrefix, store);
  try {
    requireOwnJob(*store, info, timeout, where);
    joinAgreeing(*store, info, agreed, timeout, where);
  } catch (const JoinError&) {
    throw;
  } catch (const Diagnostic&) {
    throw;
  } catch (const std::exception& e) {
    throw JoinError(where, "the group's store failed while ranks joined: " + firstLine(e.what()));
  }
  return store;
}

bool isLoopback(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1"; }

// The process group over `store`; its constructor meets every peer.
std::unique_ptr<Collectives> createGroup(const RankInfo& info, const std::string& device,
                                         const c10::intrusive_ptr<c10d::Store>& store,
                                         std::chrono::milliseconds timeout) {
  if (device == "cuda") {
#ifdef SPMD_WITH_CUDA
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, info.rank, info.worldSize, opts);
    return std::make_unique<GroupCollectives<c10d::ProcessGroupNCCL>>(store, group, info.worldSize);
#else
    throw Diagnostic("--device cuda", "this build of spmd has no CUDA support");
#endif
  }
#ifdef SPMD_HAVE_GLOO
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(isLoopback(info.masterAddr) ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                                      : c10d::ProcessGroupGloo::createDefaultDevice());
  auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, info.rank, info.worldSize, opts);
  return std::make_unique<GroupCollectives<c10d::ProcessGroupGloo>>(store, group, info.worldSize);
#else
  (void)isLoopback;
  throw Diagnostic("--device cpu", "this build of spmd has no Gloo (its LibTorch ships no Gloo headers); run on CUDA");
#endif
}

}  // namespace

std::unique_ptr<Collectives> joinProcessGroup(const RankInfo& info, const std::string& device,
                                              std::chrono::milliseconds timeout, const RunAgreement& agreed) {
  // Gloo writes to its peers' sockets with writev, which raises SIGPIPE once a
  // peer is gone (Python, PyTorch's usual host, ignores it). Ignored here, the
  // write fails with EPIPE and the collective's error says a peer was lost,
  // where the signal would kill this rank and have it reported as a failure
  // of its own.
  std::signal(SIGPIPE, SIG_IGN);
  auto store = connect(info, timeout, agreed);
  try {
    return createGroup(info, device, store, timeout);
  } catch (const Diagnostic&) {
    throw;
  } catch (...) {
    rethrowAsCollectiveError();
  }
}

}  // namespace spmd
