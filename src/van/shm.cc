// SharedMemory: memfd regions and the mappings of other processes' regions.
#include "van/shm.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>

#include "ps/shared_array.h"

namespace ps {

namespace {

std::string Errno() { return std::strerror(errno); }

size_t PageRound(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return std::max(page, (bytes + page - 1) / page * page);
}

// The memfd name of region `serial` of process `pid`; /proc/<pid>/fd/<fd>
// links to "/memfd:<name> (deleted)".
std::string RegionName(int pid, uint64_t nonce, uint64_t serial) {
  return "ps-" + std::to_string(pid) + "-" + std::to_string(nonce) + "-" +
         std::to_string(serial);
}

uint64_t RandomNonce() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

// Unmaps and closes one region (ours or theirs).
struct Unmap {
  size_t bytes;
  int fd;  // -1: none to close
  void operator()(char* base) const {
    munmap(base, bytes);
    if (fd >= 0) close(fd);
  }
};

}  // namespace

SharedMemory::SharedMemory() : nonce_(RandomNonce()) {}

SharedMemory& SharedMemory::Get() {
  static SharedMemory* registry = new SharedMemory();  // never destroyed
  return *registry;
}

const std::string& SharedMemory::Domain() {
  static const std::string domain = [] {
    std::ifstream boot("/proc/sys/kernel/random/boot_id");
    std::string boot_id;
    std::getline(boot, boot_id);
    char ns[128];
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
    if (boot_id.empty() || n <= 0) return std::string();
    return boot_id + "/" + std::string(ns, static_cast<size_t>(n)) + "/" +
           std::to_string(getuid());
  }();
  return domain;
}

StatusOr<SArray<char>> SharedMemory::Allocate(size_t bytes,
                                              const void* copy_of) {
  const bool once = copy_of != nullptr;
  const size_t size = PageRound(bytes);
  uint64_t serial;
  {
    MutexLock lock(&mu_);
    serial = next_serial_++;
  }
  const std::string name = RegionName(getpid(), nonce_, serial);
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0)
    return Status::Unavailable("memfd_create " + name + ": " + Errno());
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    Status st = Status::Unavailable("ftruncate " + name + " to " +
                                    std::to_string(size) + ": " + Errno());
    close(fd);
    return st;
  }
  // A copy goes in by write(): the kernel fills each page as it makes it,
  // where a mapping would have it zero each page first and fault it in
  // (2 to 4 times slower for 100 MB).
  for (size_t done = 0; once && done < bytes;) {
    ssize_t n = pwrite(fd, static_cast<const char*>(copy_of) + done,
                       bytes - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Status st = Status::Unavailable("write " + name + ": " + Errno());
      close(fd);
      return st;
    }
    done += static_cast<size_t>(n);
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    Status st = Status::Unavailable("mmap " + name + ": " + Errno());
    close(fd);
    return st;
  }
  char* data = static_cast<char*>(base);
  const uintptr_t key = reinterpret_cast<uintptr_t>(data);
  SArray<char> array(data, bytes, [size, fd, key](char* p) {
    SharedMemory::Get().Forget(key);
    Unmap{size, fd}(p);
  });
  MutexLock lock(&mu_);
  Region& r = by_address_[key];
  r.pid = getpid();
  r.nonce = nonce_;
  r.serial = serial;
  r.fd = fd;
  r.bytes = size;
  r.once = once;
  r.memory = array.ptr();
  by_name_[{r.pid, r.nonce, serial}] = key;
  return array;
}

void SharedMemory::Forget(uintptr_t base) {
  MutexLock lock(&mu_);
  auto it = by_address_.find(base);
  if (it == by_address_.end()) return;
  by_name_.erase({it->second.pid, it->second.nonce, it->second.serial});
  by_address_.erase(it);
}

bool SharedMemory::Find(const void* data, size_t bytes,
                        pb::SharedRef* ref) const {
  const uintptr_t p = reinterpret_cast<uintptr_t>(data);
  MutexLock lock(&mu_);
  auto it = by_address_.upper_bound(p);
  if (it == by_address_.begin()) return false;
  --it;
  const Region& r = it->second;
  if (p + bytes > it->first + r.bytes) return false;
  ref->set_pid(r.pid);
  ref->set_nonce(r.nonce);
  ref->set_region(r.serial);
  ref->set_fd(r.fd);
  ref->set_region_bytes(r.bytes);
  ref->set_offset(p - it->first);
  ref->set_once(r.once);
  return true;
}

std::string SharedMemory::Describe(const pb::SharedRef& ref) {
  return "shared region " + std::to_string(ref.region()) + " of pid " +
         std::to_string(ref.pid()) + " (" + std::to_string(ref.region_bytes()) +
         " bytes)";
}

StatusOr<std::shared_ptr<char>> SharedMemory::Map(const pb::SharedRef& ref,
                                                  bool once) const {
  const std::string path =
      "/proc/" + std::to_string(ref.pid()) + "/fd/" + std::to_string(ref.fd());
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Status::Unavailable(path + ": " + Errno());
  // What we opened must be that region (fd numbers are reused): ask our own
  // descriptor, so that nothing can change between the check and the map.
  char link[256];
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = readlink(self.c_str(), link, sizeof(link) - 1);
  const std::string target(link, static_cast<size_t>(std::max<ssize_t>(n, 0)));
  const std::string want =
      "/memfd:" + RegionName(ref.pid(), ref.nonce(), ref.region());
  if (target.compare(0, want.size(), want) != 0 ||
      (target.size() > want.size() && target[want.size()] != ' ')) {
    close(fd);
    return Status::NotFound(path + " is " + target + ", not " + want);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 ||
      static_cast<uint64_t>(st.st_size) != ref.region_bytes()) {
    close(fd);
    return Status::Corruption(path + " is not " +
                              std::to_string(ref.region_bytes()) + " bytes");
  }
  // Once: the receiver's own to write (copy-on-write; the sender never
  // sees it), and read in full soon: its pages are mapped in one call, for
  // reading (MAP_POPULATE would copy each page, as for a write).
  void* base = mmap(nullptr, ref.region_bytes(), PROT_READ | PROT_WRITE,
                    once ? MAP_PRIVATE : MAP_SHARED, fd, 0);
  close(fd);  // the mapping keeps the memory
  if (base == MAP_FAILED)
    return Status::Unavailable("mmap " + path + ": " + Errno());
#ifdef MADV_POPULATE_READ
  if (once) madvise(base, ref.region_bytes(), MADV_POPULATE_READ);  // a hint
#endif
  return std::shared_ptr<char>(static_cast<char*>(base),
                               Unmap{ref.region_bytes(), -1});
}

StatusOr<SArray<char>> SharedMemory::Resolve(const pb::SharedRef& ref,
                                             size_t bytes) {
  if (ref.offset() > ref.region_bytes() ||
      bytes > ref.region_bytes() - ref.offset()) {
    return Status::Corruption(std::to_string(bytes) + " bytes at offset " +
                              std::to_string(ref.offset()) + " leave " +
                              Describe(ref));
  }
  if (ref.once()) return ResolveOnce(ref, bytes);
  std::shared_ptr<char> base;  // released outside the lock (see Forget)
  {
    MutexLock lock(&mu_);
    auto it = by_name_.find({ref.pid(), ref.nonce(), ref.region()});
    if (it != by_name_.end()) {
      const Region& r = by_address_.at(it->second);
      base = r.pid == getpid() ? r.memory.lock() : r.kept;
      if (base == nullptr || r.bytes != ref.region_bytes()) {
        return Status::NotFound(Describe(ref) + " is gone");
      }
    }
  }
  if (base == nullptr) {
    if (ref.pid() == getpid())
      return Status::NotFound(Describe(ref) + " is gone");
    StatusOr<std::shared_ptr<char>> mapped = Map(ref, false);
    if (!mapped.ok()) {
      return Status(
          mapped.status().code(),
          "cannot map " + Describe(ref) + ": " + mapped.status().message());
    }
    base = std::move(mapped).value();
    MutexLock lock(&mu_);
    auto [it, fresh] =
        by_name_.emplace(Name(ref.pid(), ref.nonce(), ref.region()),
                         reinterpret_cast<uintptr_t>(base.get()));
    if (fresh) {
      Region& r = by_address_[it->second];
      r.pid = ref.pid();
      r.nonce = ref.nonce();
      r.serial = ref.region();
      r.fd = ref.fd();
      r.bytes = ref.region_bytes();
      r.kept = base;
    } else {
      base = by_address_.at(it->second).kept;  // another thread mapped it first
    }
  }
  SArray<char> region(base.get(), ref.region_bytes(), [base](char*) {});
  return region.segment(ref.offset(), ref.offset() + bytes);
}

StatusOr<SArray<char>> SharedMemory::ResolveOnce(const pb::SharedRef& ref,
                                                 size_t bytes) {
  if (ref.pid() == getpid()) {
    // Our own (a node of this process): a copy, which is ours to write.
    std::shared_ptr<char> base;
    {
      MutexLock lock(&mu_);
      auto it = by_name_.find({ref.pid(), ref.nonce(), ref.region()});
      if (it != by_name_.end()) {
        const Region& r = by_address_.at(it->second);
        if (r.bytes == ref.region_bytes()) base = r.memory.lock();
      }
    }
    if (base == nullptr) return Status::NotFound(Describe(ref) + " is gone");
    SArray<char> copy;
    copy.CopyFrom(base.get() + ref.offset(), bytes);
    return copy;
  }
  StatusOr<std::shared_ptr<char>> mapped = Map(ref, true);
  if (!mapped.ok()) {
    return Status(mapped.status().code(), "cannot map " + Describe(ref) + ": " +
                                              mapped.status().message());
  }
  std::shared_ptr<char> base = std::move(mapped).value();
  SArray<char> region(base.get(), ref.region_bytes(), [base](char*) {});
  return region.segment(ref.offset(), ref.offset() + bytes);
}

SArray<char> CopyForMessage(const void* data, size_t bytes, bool shared) {
  if (shared && bytes >= kSharedCopyBytes) {
    StatusOr<SArray<char>> region = SharedMemory::Get().Allocate(bytes, data);
    if (region.ok()) return std::move(region).value();
  }
  SArray<char> copy;
  copy.CopyFrom(static_cast<const char*>(data), bytes);
  return copy;
}

namespace detail {

SArray<char> AllocateSharedBytes(size_t bytes) {
  StatusOr<SArray<char>> region = SharedMemory::Get().Allocate(bytes);
  if (region.ok()) return std::move(region).value();
  static std::once_flag warned;
  std::call_once(warned, [&] {
    LOG(WARNING) << "no shared memory (" << region.status().message()
                 << "); shared arrays are ordinary ones and travel through "
                    "the socket";
  });
  SArray<uint64_t> words((bytes + 7) / 8, 0);
  return SArray<char>(words).segment(0, bytes);
}

}  // namespace detail

}  // namespace ps
