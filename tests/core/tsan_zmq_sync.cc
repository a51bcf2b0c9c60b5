// ThreadSanitizer build only (PS_TSAN): tells TSan about the happens-before
// edges that ZeroMQ creates, which it cannot see because Debian's libzmq is
// not instrumented. Without this, every message looks like a data race: the
// receiver reads what the sender wrote before sending (a handler's reply
// after Wait, a shared-memory frame), and libzmq's I/O thread frees a
// zero-copy frame that the sending thread allocated (Van's ReleaseFrame).
//
// Linked into the test programs, these definitions take the place of
// libzmq's for every call from the ps library and forward to it:
// - zmq_send (Van sends each message's header with it) releases on a sync
//   object chosen by the header's bytes; zmq_msg_recv acquires on the one
//   chosen by each received part's bytes, so the header that arrives
//   acquires what its sender released. Parts that are not headers match
//   nothing, or on a hash collision (about one in a million per part) add
//   an edge that is not there, which can only hide a race, never invent one.
// - zmq_msg_init_data releases on the frame's free-function record, and the
//   free function, called on libzmq's I/O thread, acquires it first.
// libzmq's own memory accesses are ignored (scripts/tsan_suppressions.txt).
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>
#include <zmq.h>

#include <cstddef>
#include <functional>
#include <string_view>

namespace {

// One byte per sync object: TSan keys a sync object on its address.
char sync_slots[1 << 20];

void* SlotOf(const void* data, size_t size) {
  size_t h = std::hash<std::string_view>()(
      std::string_view(static_cast<const char*>(data), size));
  return &sync_slots[h % sizeof(sync_slots)];
}

template <typename F>
F Real(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) __builtin_trap();
  return reinterpret_cast<F>(f);
}

struct FreeRecord {
  zmq_free_fn* fn;
  void* hint;
};

void FreeWithAcquire(void* data, void* hint) {
  auto* record = static_cast<FreeRecord*>(hint);
  __tsan_acquire(record);
  if (record->fn != nullptr) record->fn(data, record->hint);
  delete record;
}

}  // namespace

extern "C" int zmq_send(void* socket, const void* buf, size_t len, int flags) {
  static auto real = Real<int (*)(void*, const void*, size_t, int)>("zmq_send");
  __tsan_release(SlotOf(buf, len));
  return real(socket, buf, len, flags);
}

extern "C" int zmq_msg_recv(zmq_msg_t* msg, void* socket, int flags) {
  static auto real = Real<int (*)(zmq_msg_t*, void*, int)>("zmq_msg_recv");
  int rc = real(msg, socket, flags);
  if (rc >= 0) __tsan_acquire(SlotOf(zmq_msg_data(msg), zmq_msg_size(msg)));
  return rc;
}

extern "C" int zmq_msg_init_data(zmq_msg_t* msg, void* data, size_t size,
                                 zmq_free_fn* ffn, void* hint) {
  static auto real =
      Real<int (*)(zmq_msg_t*, void*, size_t, zmq_free_fn*, void*)>(
          "zmq_msg_init_data");
  auto* record = new FreeRecord{ffn, hint};
  __tsan_release(record);
  int rc = real(msg, data, size, FreeWithAcquire, record);
  if (rc != 0) delete record;  // libzmq took no ownership
  return rc;
}
