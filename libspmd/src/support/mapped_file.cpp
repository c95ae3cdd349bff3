#include "spmd/support/mapped_file.h"

#include "spmd/support/diagnostic.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace spmd {

MappedFile::MappedFile(const std::string& path, Access access) {
  // Checked before the open, which would wait for a FIFO's writer.
  struct stat before {};
  if (::stat(path.c_str(), &before) == 0 && !S_ISREG(before.st_mode)) {
    throw Diagnostic("", S_ISDIR(before.st_mode) ? "is a directory, not a file" : "not a regular file").inFile(path);
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Diagnostic("", std::string("cannot open: ") + std::strerror(errno)).inFile(path);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Diagnostic("", S_ISDIR(st.st_mode) ? "is a directory, not a file" : "not a regular file").inFile(path);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    const int protection = access == Access::ReadOnly ? PROT_READ : PROT_READ | PROT_WRITE;
    data_ = ::mmap(nullptr, size_, protection, MAP_PRIVATE, fd, 0);
    if (data_ == MAP_FAILED) {
      data_ = nullptr;
      const int error = errno;
      ::close(fd);
      throw Diagnostic("", std::string("cannot map: ") + std::strerror(error)).inFile(path);
    }
  }
  ::close(fd);
}

void MappedFile::prefault() const {
#ifndef MADV_POPULATE_READ
  constexpr int MADV_POPULATE_READ = 22;  // Linux 5.14; older headers lack it
#endif
  if (data_) ::madvise(data_, size_, MADV_POPULATE_READ);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

}  // namespace spmd
