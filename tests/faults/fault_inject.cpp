// An LD_PRELOAD library for run.checkpoint_crash: it makes a process fail
// where checkpoint writing is fragile, without root, strace or a full disk.
//
//   SPMD_FAULT_KILL_AT=N      SIGKILL at the N-th call (1-based) of rename,
//                             renameat, renameat2, unlink, unlinkat, rmdir or
//                             fsync, before the call runs
//   SPMD_FAULT_FSYNC_ERRNO=E  every fsync fails with errno E (5: EIO); with
//                             SPMD_FAULT_FSYNC_FOLDERS=1, only a folder's
//   SPMD_FAULT_CALL=C SPMD_FAULT_PATH=S SPMD_FAULT_ERRNO=E
//                             the calls of family C (rename, unlink or rmdir)
//                             on a path containing S fail with errno E
//
// Calls are counted in each process on its own.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace {

long envNumber(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atol(v) : 0;
}

std::atomic<long> calls{0};

void countCall() {
  static const long killAt = envNumber("SPMD_FAULT_KILL_AT");
  if (killAt > 0 && ++calls == killAt) ::raise(SIGKILL);
}

// Whether the call family `call` on `path` (or `other`, a rename's target)
// is to fail; sets errno when it is.
bool injected(const char* call, const char* path, const char* other = nullptr) {
  static const char* family = std::getenv("SPMD_FAULT_CALL");
  static const char* part = std::getenv("SPMD_FAULT_PATH");
  static const long error = envNumber("SPMD_FAULT_ERRNO");
  if (!family || !part || error <= 0 || std::strcmp(family, call) != 0) return false;
  const bool hit = (path && std::strstr(path, part)) || (other && std::strstr(other, part));
  if (hit) errno = static_cast<int>(error);
  return hit;
}

template <class F>
F real(const char* name) {
  return reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" {

int rename(const char* from, const char* to) {
  countCall();
  if (injected("rename", from, to)) return -1;
  static const auto f = real<int (*)(const char*, const char*)>("rename");
  return f(from, to);
}

int renameat(int fromDir, const char* from, int toDir, const char* to) {
  countCall();
  if (injected("rename", from, to)) return -1;
  static const auto f = real<int (*)(int, const char*, int, const char*)>("renameat");
  return f(fromDir, from, toDir, to);
}

int renameat2(int fromDir, const char* from, int toDir, const char* to, unsigned flags) {
  countCall();
  if (injected("rename", from, to)) return -1;
  static const auto f = real<int (*)(int, const char*, int, const char*, unsigned)>("renameat2");
  return f(fromDir, from, toDir, to, flags);
}

int unlink(const char* path) {
  countCall();
  if (injected("unlink", path)) return -1;
  static const auto f = real<int (*)(const char*)>("unlink");
  return f(path);
}

int unlinkat(int dir, const char* path, int flags) {
  countCall();
  if (injected((flags & AT_REMOVEDIR) ? "rmdir" : "unlink", path)) return -1;
  static const auto f = real<int (*)(int, const char*, int)>("unlinkat");
  return f(dir, path, flags);
}

int rmdir(const char* path) {
  countCall();
  if (injected("rmdir", path)) return -1;
  static const auto f = real<int (*)(const char*)>("rmdir");
  return f(path);
}

int fsync(int fd) {
  countCall();
  static const long error = envNumber("SPMD_FAULT_FSYNC_ERRNO");
  static const bool foldersOnly = envNumber("SPMD_FAULT_FSYNC_FOLDERS") == 1;
  struct stat st {};
  const bool folder = ::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
  if (error > 0 && (folder || !foldersOnly)) {
    errno = static_cast<int>(error);
    return -1;
  }
  static const auto f = real<int (*)(int)>("fsync");
  return f(fd);
}

}  // extern "C"
