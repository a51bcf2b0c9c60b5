// The ps-lite style convenience layer over one default node per process:
// ps::Start reads the environment and the --ps_* flags
// (Config::FromEnvAndFlags), starts the node and waits for the rendezvous;
// KVWorker<Val>(app_id, customer_id) and KVServer<Val>(app_id) then use it.
// This is the program's edge: a bad environment or flag, a failed rendezvous,
// and a dead peer (a NODE_FAILED for a node this one talks to) end the process
// with exit code 1 and a message naming the variable, the address or the dead
// node. Programs that want Status values instead use ps::Node directly.
//
// Thread-safety: Start/StartAsync/Finalize from the main thread; the
// accessors and Barrier from any thread between them.
#ifndef PS_PS_H_
#define PS_PS_H_

#include "ps/base.h"
#include "ps/config.h"
#include "ps/kv_app.h"
#include "ps/node.h"
#include "ps/placement.h"
#include "ps/sarray.h"
#include "ps/shared_array.h"
#include "ps/status.h"

namespace ps {

// Rendezvous, then a barrier of all nodes (so every server's KVServer may be
// built before workers send; early requests are held anyway).
void Start(int customer_id, const char* argv0 = nullptr);
// Rendezvous without the barrier.
void StartAsync(int customer_id, const char* argv0 = nullptr);
// Barrier of all nodes (when do_barrier), then an ordered shutdown.
void Finalize(int customer_id, bool do_barrier = true);

int NumWorkers();
int NumServers();
int MyRank();
bool IsWorker();
bool IsServer();
bool IsScheduler();
// Blocks until all of `group` arrived; exits the process naming the missing
// nodes on timeout or a dead member.
void Barrier(int customer_id, int group);
void Barrier(int group);

}  // namespace ps

#endif  // PS_PS_H_
