// Uses the installed headers and library: a one-server, one-worker job in
// one process, pushing and pulling one key. Exits 0 when the pull is exact.
#include <cstdio>
#include <thread>

#include "ps/ps.h"

int main() {
  ps::Config base;
  base.num_servers = 1;
  base.num_workers = 1;
  ps::Config sc = base;
  sc.role = ps::Role::kScheduler;
  ps::Node scheduler(sc);
  if (!scheduler.Bind().ok()) return 1;
  ps::Config server_config = base, worker_config = base;
  server_config.role = ps::Role::kServer;
  worker_config.role = ps::Role::kWorker;
  server_config.root_port = worker_config.root_port = scheduler.port();
  ps::Node server(server_config), worker(worker_config);
  std::thread ts([&] { (void)scheduler.Start(); });
  std::thread tv([&] { (void)server.Start(); });
  if (!worker.Start().ok()) return 1;
  ts.join();
  tv.join();
  ps::KVServer<float> kv_server(&server, 0);
  ps::KVServerDefaultHandle<float> handle;
  kv_server.set_request_handle(handle);
  ps::KVWorker<float> kv(&worker, 0, 0);
  std::vector<float> out;
  bool ok = kv.Wait(kv.Push({7}, {2.5f, 3.5f})).ok() &&
            kv.Wait(kv.Pull({7}, &out)).ok() &&
            out == std::vector<float>{2.5f, 3.5f};
  std::printf("consumer: %s\n", ok ? "ok" : "WRONG");
  std::thread fs([&] { (void)scheduler.Finalize(); });
  std::thread fv([&] { (void)server.Finalize(); });
  (void)worker.Finalize();
  fs.join();
  fv.join();
  return ok ? 0 : 1;
}
