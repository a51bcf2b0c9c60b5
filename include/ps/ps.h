// The ps-lite style convenience layer over one default node per process:
// ps::Start reads the environment and the --ps_* flags
// (Config::FromEnvAndFlags), starts the node and waits for the rendezvous;
// KVWorker<Val>(app_id, customer_id) and KVServer<Val>(app_id) then use it.
// This is the program's edge: a bad environment or flag, a failed rendezvous,
// and a dead peer (a NODE_FAILED for a node this one talks to) end the process
// with exit code 1 and a message naming the variable, the address or the dead
// node. Programs that want Status values instead use ps::Node directly.
//
// The roles and counts (IsServer, NumWorkers...) are known before Start:
// the default node is made from the environment on first use, so servers
// may build their KVServer (and any node a SimpleApp) before Start, as
// ps-lite programs do. ps-lite's Postoffice::Get() (ps/internal/
// postoffice.h), Environment (ps/internal/env.h: values given to
// Environment::Init before the default node is made override the process
// environment's) and SimpleApp (ps/simple_app.h) come with this header.
//
// Thread-safety: Start/StartAsync/Finalize from any thread, one customer id
// each; the accessors and Barrier from any thread between them.
#ifndef PS_PS_H_
#define PS_PS_H_

#include <functional>

#include "ps/base.h"
#include "ps/compress.h"
#include "ps/config.h"
#include "ps/internal/env.h"
#include "ps/internal/postoffice.h"
#include "ps/internal/utils.h"
#include "ps/kv_app.h"
#include "ps/node.h"
#include "ps/placement.h"
#include "ps/range.h"
#include "ps/sarray.h"
#include "ps/shared_array.h"
#include "ps/simple_app.h"
#include "ps/status.h"

namespace ps {

// Rendezvous, then a barrier of all nodes (so every server's KVServer may be
// built before workers send; early requests are held anyway). As in
// ps-lite, each worker customer a process starts is a worker of the job:
// DMLC_NUM_WORKER counts them, and several threads of one worker process
// may each Start their own (ps-lite's multi-worker form). The first uses
// the process's default node; each later one gets a node of its own (its
// own rank and connections, the same configuration), which
// KVWorker(app_id, customer_id), SimpleApp(app_id, customer_id) and
// Barrier(customer_id, group) then use. Customers of a server or of the
// scheduler share the default node.
void Start(int customer_id, const char* argv0 = nullptr);
// Rendezvous without the barrier.
void StartAsync(int customer_id, const char* argv0 = nullptr);
// Ends `customer_id`. A worker customer with a node of its own stops that
// node. As in ps-lite, customer 0 stops the default node, after waiting (up
// to PS_BARRIER_TIMEOUT_MS) for the process's other customers on it to
// finalize; without a customer 0, the last one does. Stopping is a barrier
// of all nodes (when do_barrier), an ordered shutdown, then (the default
// node's) the exit callback.
void Finalize(int customer_id, bool do_barrier = true);
// Older ps-lite releases' forms (one customer per process): Start(0, argv0)
// and Finalize(0, true).
void Start(const char* argv0 = nullptr);
void Finalize();
// Runs `cb` after the default node stopped, in the Finalize that stops it
// (ps-lite: e.g. to
// delete a KVServer). A later registration replaces an earlier one.
void RegisterExitCallback(const std::function<void()>& cb);

int NumWorkers();
int NumServers();
int MyRank();
bool IsWorker();
bool IsServer();
bool IsScheduler();
// Blocks until all of `group` arrived (on customer_id's node); exits the
// process naming the missing nodes on timeout or a dead member.
void Barrier(int customer_id, int group);
void Barrier(int group);

}  // namespace ps

#endif  // PS_PS_H_
