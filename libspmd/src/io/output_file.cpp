#include "spmd/io/output_file.h"
#include "spmd/io/folder.h"

#include "spmd/support/diagnostic.h"
#include "spmd/support/phase_times.h"
#include "spmd/support/write_all.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>

namespace spmd {

std::string displayNameOf(const std::string& path) { return path == "-" ? "<stdin>" : path; }

namespace {

std::string errnoText() { return errno ? std::strerror(errno) : "nothing written"; }

}  // namespace

namespace {

// The file a write to `path` lands in: a symbolic link's target (the link
// stays a link), else `path` itself.
std::string writtenPath(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path at = path;
  for (int hops = 0; fs::is_symlink(fs::symlink_status(at)); ++hops) {
    std::error_code error;
    const fs::path target = fs::read_symlink(at, error);
    if (error || hops == 40) {
      throw Diagnostic("", "cannot write through the link: " + (error ? error.message() : "too many links")).inFile(path);
    }
    at = target.is_absolute() ? target : at.parent_path() / target;  // a dangling link's target is created
  }
  return at.string();
}

// Opens an existing target that is not a regular file to be written in
// place (a character device such as /dev/null, or a FIFO with a reader);
// -1 with errno set where it cannot be, or is something else.
int openInPlace(const std::string& path, mode_t mode) {
  if (S_ISDIR(mode)) {
    errno = EISDIR;
    return -1;
  }
  if (!S_ISCHR(mode) && !S_ISFIFO(mode)) {
    errno = EINVAL;  // a socket or block device: not something spmd writes to
    return -1;
  }
  // A FIFO without a reader would block the open: refused instead (ENXIO).
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | (S_ISFIFO(mode) ? O_NONBLOCK : 0));
  if (fd >= 0 && S_ISFIFO(mode)) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace

void makeFolder(const std::string& dir, const std::string& flag) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return;
  if (::mkdir(dir.c_str(), 0777) != 0) {
    throw Diagnostic(flag, "cannot make the folder " + dir + ": " + std::strerror(errno));
  }
}

std::string temporaryBeside(const std::string& target, const std::string& tag) {
  const size_t slash = target.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "" : target.substr(0, slash + 1);
  std::string base = slash == std::string::npos ? target : target.substr(slash + 1);
  const std::string suffix = tag + std::to_string(::getpid());
  const long limit = ::pathconf(dir.empty() ? "." : dir.c_str(), _PC_NAME_MAX);
  const size_t nameMax = limit > 0 ? static_cast<size_t>(limit) : 255;
  if (base.size() + suffix.size() > nameMax) base.resize(nameMax > suffix.size() ? nameMax - suffix.size() : 0);
  return dir + base + suffix;
}

OutputFile::OutputFile(const std::string& path) : path_(path) {
  if (path == "-") {
    std::cout.flush();
    fd_ = STDOUT_FILENO;
    return;
  }
  const std::string target = writtenPath(path);
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    fd_ = openInPlace(target, st.st_mode);
    if (fd_ < 0) {
      const std::string why = errno == EINVAL ? "not a regular file, a character device or a FIFO"
                              : errno == ENXIO ? "a FIFO that nobody reads"
                                               : errnoText();
      throw Diagnostic("", "cannot write: " + why).inFile(path_);
    }
    inPlace_ = true;
    return;
  }
  target_ = target;
  temp_ = temporaryBeside(target, ".tmp.");
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Diagnostic("", "cannot write: " + errnoText()).inFile(path_);
}

OutputFile::~OutputFile() {
  if (inPlace_ && fd_ >= 0) ::close(fd_);
  if (committed_ || temp_.empty()) return;
  if (fd_ >= 0) ::close(fd_);
  std::remove(temp_.c_str());
}

void OutputFile::fail() {
  const std::string why = errnoText();
  if (!temp_.empty()) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    std::remove(temp_.c_str());
    temp_.clear();
  }
  throw Diagnostic("", "cannot write: " + why).inFile(path_);
}

void OutputFile::write(const void* data, size_t size) {
  if (!writeAll(fd_, data, size)) fail();
}

void OutputFile::commit() {
  committed_ = true;
  if (inPlace_) {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail();
    return;
  }
  if (temp_.empty()) return;
  if (::close(fd_) != 0) {
    fd_ = -1;
    committed_ = false;
    fail();
  }
  fd_ = -1;
  if (std::rename(temp_.c_str(), target_.c_str()) != 0) {
    committed_ = false;
    fail();
  }
}

void writeOutput(const std::string& path, const std::string& content) {
  TimedPhase phase("write " + displayNameOf(path));
  OutputFile out(path);
  out.write(content.data(), content.size());
  out.commit();
}

}  // namespace spmd
