// Basic vocabulary of ps: keys, roles, node ids and group ids.
// Node ids follow ps-lite: the scheduler is 1, server rank r is 8 + 2r,
// worker rank r is 9 + 2r; ids 1, 2, 4 name the groups (scheduler, servers,
// workers) and their bit-or names a union (e.g. kServerGroup | kWorkerGroup).
#ifndef PS_BASE_H_
#define PS_BASE_H_

#include <cstdint>
#include <limits>
#include <string>

namespace ps {

using Key = uint64_t;
constexpr Key kMaxKey = std::numeric_limits<Key>::max();

enum class Role { kScheduler = 0, kServer = 1, kWorker = 2 };

constexpr int kScheduler = 1;
constexpr int kServerGroup = 2;
constexpr int kWorkerGroup = 4;
constexpr int kAllGroups = kScheduler | kServerGroup | kWorkerGroup;

constexpr int kSchedulerId = 1;
inline int ServerRankToId(int rank) { return 8 + 2 * rank; }
inline int WorkerRankToId(int rank) { return 9 + 2 * rank; }
// The rank of a server or worker id; -1 for the scheduler or a group id.
inline int IdToRank(int id) { return id < 8 ? -1 : (id - 8) / 2; }
inline bool IsServerId(int id) { return id >= 8 && id % 2 == 0; }
// Replication (Config::replicas = 1): server rank r's keys are also held by
// server ReplicaOf(r), which holds them for PrimaryOf(its rank).
inline int ReplicaOf(int rank, int num_servers) {
  return (rank + 1) % num_servers;
}
inline int PrimaryOf(int rank, int num_servers) {
  return (rank + num_servers - 1) % num_servers;
}
inline bool IsWorkerId(int id) { return id >= 8 && id % 2 == 1; }

inline const char* RoleName(Role role) {
  switch (role) {
    case Role::kScheduler:
      return "scheduler";
    case Role::kServer:
      return "server";
    case Role::kWorker:
      return "worker";
  }
  return "unknown";
}

// "scheduler", "server 2", "worker 0", or "group 6" for a group id.
inline std::string DescribeId(int id) {
  if (id == kSchedulerId) return "scheduler";
  if (IsServerId(id)) return "server " + std::to_string(IdToRank(id));
  if (IsWorkerId(id)) return "worker " + std::to_string(IdToRank(id));
  return "group " + std::to_string(id);
}

// "workers+servers+scheduler" style name of a group id.
inline std::string GroupName(int group) {
  std::string s;
  if (group & kWorkerGroup) s += "workers";
  if (group & kServerGroup) s += std::string(s.empty() ? "" : "+") + "servers";
  if (group & kScheduler) s += std::string(s.empty() ? "" : "+") + "scheduler";
  return s.empty() ? "empty group" : s;
}

}  // namespace ps

#endif  // PS_BASE_H_
