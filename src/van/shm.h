// SharedMemory: memory that other processes on this host can map, and the
// mappings of theirs this process made. A data frame that lies in such
// memory goes to a co-located node as a reference (pb::SharedRef, a few
// bytes in the header) instead of through the socket: the receiver maps the
// sender's region once and reads the bytes where they are. A pull can also
// name its destination in the worker's shared memory (Meta.reply_into); the
// server then writes its answer there with one memcpy.
//
// A region is a memfd (memfd_create) mapped MAP_SHARED and kept open, named
// "ps-<pid>-<nonce>-<serial>" (nonce: random per process); another process
// maps it by opening /proc/<pid>/fd/<fd> and checking the name, which works
// for processes of the same user in the same pid namespace on the same boot
// (the domain, Domain()) unless something forbids it (a non-dumpable
// process, /proc mounted hidepid, a security module). So that such a pair
// never stalls, nodes of one domain probe each other at rendezvous (a page
// each, NodeInfo.shm_probe) and send references only to peers that mapped
// theirs. Nothing is left in /dev/shm when a process dies: the kernel frees
// a memfd with its last mapping.
//
// Lifetime: a reference is valid while the sender keeps the bytes unchanged,
// which the KV layer's contracts give (a push's values until Wait returns;
// a pull's destination until its answer came). A mapping of another
// process's region is made once and kept until this process exits.
//
// Process-wide, as memory is: one registry for every Node of the process.
// Thread-safe.
#ifndef PS_SRC_VAN_SHM_H_
#define PS_SRC_VAN_SHM_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "meta.pb.h"
#include "ps/sarray.h"
#include "ps/status.h"
#include "van/sync.h"

namespace ps {

class SharedMemory {
 public:
  // The process's registry.
  static SharedMemory& Get();

  // "<boot id>/<pid namespace>/<uid>": processes with equal domains can map
  // each other's regions. Empty when /proc does not tell.
  static const std::string& Domain();

  // A new zero-filled region of `bytes` (at least one page); the region is
  // unmapped and closed when the last copy of the array goes (a process
  // that mapped it keeps its mapping, and so the memory, until it exits).
  // With `copy_of`: a region holding a copy of its `bytes` bytes, for one
  // message (SharedRef.once): a receiver maps it privately (copy-on-write)
  // and unmaps it when its frame goes, instead of keeping a shared mapping.
  StatusOr<SArray<char>> Allocate(size_t bytes, const void* copy_of = nullptr)
      EXCLUDES(mu_);

  // Whether [data, data + bytes) lies within one region of this process or
  // one it mapped; if so fills every field of `ref` but `frame` and `bytes`.
  bool Find(const void* data, size_t bytes, pb::SharedRef* ref) const
      EXCLUDES(mu_);

  // The `bytes` bytes at ref.offset of the region `ref` names: a region of
  // this process, or another process's, mapped on first use. Errors name
  // the region, the process and why (e.g. /proc/<pid>/fd/<fd>: Permission
  // denied).
  StatusOr<SArray<char>> Resolve(const pb::SharedRef& ref, size_t bytes)
      EXCLUDES(mu_);

 private:
  // (pid, nonce, serial): a region's name, unique even across a reused pid.
  using Name = std::tuple<int, uint64_t, uint64_t>;
  struct Region {
    int pid = 0;
    uint64_t nonce = 0;
    uint64_t serial = 0;
    int fd = -1;  // in process `pid`
    size_t bytes = 0;
    bool once = false;           // ours, made by Allocate(bytes, copy_of)
    std::weak_ptr<char> memory;  // ours: expires when freed
    std::shared_ptr<char> kept;  // theirs: our mapping, kept for good
  };

  SharedMemory();
  void Forget(uintptr_t base) EXCLUDES(mu_);
  // Maps another process's region: shared, or (once) copy-on-write.
  StatusOr<std::shared_ptr<char>> Map(const pb::SharedRef& ref,
                                      bool once) const;
  static std::string Describe(const pb::SharedRef& ref);
  // Resolve for a region made for one message (SharedRef.once).
  StatusOr<SArray<char>> ResolveOnce(const pb::SharedRef& ref, size_t bytes)
      EXCLUDES(mu_);

  mutable Mutex mu_;  // guards the maps and next_serial_
  std::map<uintptr_t, Region> by_address_ GUARDED_BY(mu_);  // by base address
  std::map<Name, uintptr_t> by_name_ GUARDED_BY(mu_);
  const uint64_t nonce_;  // random, per process
  uint64_t next_serial_ GUARDED_BY(mu_) = 1;
};

// Copies smaller than this go in ordinary arrays: they cost less than a
// region (a memfd, and a mapping at each end).
constexpr size_t kSharedCopyBytes = size_t{1} << 20;

// A copy of `bytes` bytes at `data` for one message: when `shared` (its
// receiver maps this process's memory, Van::SharesMemoryWith) and it is
// large, in a region of its own (Allocate with copy_of), which the
// receiver maps instead of taking the bytes from the socket; else in an
// ordinary array.
SArray<char> CopyForMessage(const void* data, size_t bytes, bool shared);

}  // namespace ps

#endif  // PS_SRC_VAN_SHM_H_
