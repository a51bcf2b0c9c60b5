// Whole clusters of NodeProtocol objects (src/postoffice/node_protocol.h)
// run from scripts, without sockets, threads or sleeps: a simulator routes
// each node's output messages to the others over links that lose, delay or
// cut them, ticks every node's timer in virtual time, and kills, freezes
// and thaws nodes as the script says. Each scenario in tests/core/scenarios/
// is a list of commands, each followed by "----" and the output it must
// give (the format of etcd's datadriven tests):
//
//   cluster servers=2 workers=2 replicas=1
//   ----
//   ok
//
//   kill s1
//   ----
//   ...
//
// The output names what the protocol did: the messages it sent (all but
// heartbeats), the membership's events, drops, log lines and barrier
// releases, each with the virtual time in ms. Run with PS_UPDATE_GOLDEN=1
// to write the outputs into the files instead (then read the diff).
//
// Commands:
//   cluster servers=S workers=W [replicas=1] [restarts=N] [interval=MS]
//           [timeout=MS] [rejoin=MS] [barrier=MS] [connect=MS]
//                       a job just started
//   run MS              advance virtual time, delivering and ticking
//   kill NODE           the process dies: its connections drop
//   freeze NODE / thaw NODE   SIGSTOP and SIGCONT
//   cut A B / heal A B  a partition between A and B (both ways); "cut A *"
//                       cuts A from every node
//   close A B           the connections between A and B close and cannot
//                       be made again, both processes alive (a cut that
//                       outlasted ZeroMQ's heartbeat, the reconnects failed
//                       by the routes); "close A *": A's every connection
//   loss A B PERCENT    A's messages to B are lost with this chance
//   drop A B N          A's next N messages to B are lost
//   barrier NODE[,NODE...] GROUP   the nodes enter GROUP's barrier
//                       (servers, workers, all)
//   finalize NODE       a clean goodbye (TERMINATE), then it stops
//   crash NODE          it stops without Finalize (TERMINATE with an error)
//   data FROM TO        FROM sends TO a data message (fenced, or taken)
//   restart NODE        a new process for NODE: a worker registers as the
//                       restart of its rank (PS_MAX_RESTARTS); the scheduler
//                       binds the old one's address and awaits the members'
//                       reports (the old process must be stopped)
//   inject FROM TO node_failed ID VERDICT [BY]   FROM sends a NODE_FAILED
//   state               every live node's view of every node
// NODE: sched, s0, s1, ..., w0, w1, ...
//
// A message goes to the process at the address its sender's table has for
// the receiver (a restarted worker is at a new port): one sent to an
// address nobody listens on any more is lost, and one whose sender is not
// at the address the receiver's table has for it is dropped, as the
// Postoffice drops what its connection does not prove.
#include <glog/logging.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "postoffice/node_protocol.h"
#include "ps/base.h"

namespace ps {
namespace core {
namespace {

using Clock = NodeProtocol::Clock;
using Output = NodeProtocol::Output;

// The watch's grace for a lost connection (the Postoffice's).
constexpr int kGraceMs = 250;
// One hop on a link.
constexpr int kDelayMs = 1;
// Each node's first process listens here, a restart at the next port.
constexpr int kFirstPort = 9000;
// A registering restart's connection, before it takes the worker's id.
constexpr int kFirstTempId = 1000;

std::string NameOf(int id) {
  if (id == kSchedulerId) return "sched";
  if (id >= kFirstTempId) return "temp" + std::to_string(id - kFirstTempId);
  if (IsServerId(id)) return "s" + std::to_string(IdToRank(id));
  if (IsWorkerId(id)) return "w" + std::to_string(IdToRank(id));
  return "node" + std::to_string(id);
}

int IdOf(const std::string& name) {
  if (name == "sched") return kSchedulerId;
  if (name.size() >= 2 && (name[0] == 's' || name[0] == 'w')) {
    const int rank = std::stoi(name.substr(1));
    return name[0] == 's' ? ServerRankToId(rank) : WorkerRankToId(rank);
  }
  ADD_FAILURE() << "no node " << name;
  return -1;
}

int GroupOf(const std::string& name) {
  if (name == "servers") return kServerGroup;
  if (name == "workers") return kWorkerGroup;
  if (name == "all") return kAllGroups;
  ADD_FAILURE() << "no group " << name;
  return 0;
}

std::string GroupName(int group) {
  return group == kServerGroup   ? "servers"
         : group == kWorkerGroup ? "workers"
         : group == kAllGroups   ? "all"
                                 : std::to_string(group);
}

const char* VerdictName(pb::Verdict v) {
  switch (v) {
    case pb::LOSE:
      return "lose";
    case pb::AWAIT:
      return "await";
    case pb::COVER:
      return "cover";
    default:
      return "unset";
  }
}

// One message as the output names it ("" for a heartbeat: not shown).
std::string Describe(const Message& msg) {
  const pb::Meta& m = msg.meta;
  const pb::Control& c = m.control();
  switch (c.cmd()) {
    case pb::HEARTBEAT:
      return "";
    case pb::EMPTY:
      return "data";
    case pb::NODE_FAILED: {
      std::string s = "NODE_FAILED " +
                      (c.node_size() > 0 ? NameOf(c.node(0).id()) : "?") + " " +
                      VerdictName(c.verdict());
      if (c.verdict() == pb::COVER) s += " by " + NameOf(c.covered_by());
      return s + " (" + c.error() + ")";
    }
    case pb::BARRIER:
      if (m.request()) return "BARRIER " + GroupName(c.barrier_group());
      return "BARRIER " + GroupName(c.barrier_group()) + " released" +
             (c.error().empty() ? "" : ": " + c.error());
    case pb::TERMINATE:
      return c.error().empty() ? "TERMINATE" : "TERMINATE (" + c.error() + ")";
    case pb::ADD_NODE:
      if (m.request()) return "ADD_NODE report";
      if (!c.error().empty()) return "ADD_NODE refused: " + c.error();
      return c.rejoin() ? "ADD_NODE node table (rejoin)"
                        : "ADD_NODE node table";
    case pb::NODE_JOINED:
      return std::string("NODE_JOINED ") +
             (c.node_size() > 0 ? NameOf(c.node(0).id()) + " at port " +
                                      std::to_string(c.node(0).port())
                                : "?") +
             (m.request() ? "" : " (answer)");
    default:
      return "command " + std::to_string(c.cmd());
  }
}

std::string EventLine(const PeerEvent& e) {
  std::string s = std::string(PeerEventName(e.kind)) + " " + NameOf(e.id) +
                  " " + PeerStateName(e.from) + " -> " + PeerStateName(e.to);
  if (e.kind == PeerEvent::kPeerCovered) s += " by " + NameOf(e.by);
  return s;
}

class Sim {
 public:
  // Runs one command; returns its output.
  std::string Do(const std::string& line) {
    out_.str("");
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    std::vector<std::string> args;
    for (std::string a; in >> a;) args.push_back(a);
    if (cmd == "cluster") {
      Cluster(args);
      out_ << "ok\n";
    } else if (cmd == "run") {
      Run(std::stoi(args.at(0)));
    } else if (cmd == "kill") {
      Kill(IdOf(args.at(0)));
    } else if (cmd == "freeze") {
      nodes_.at(IdOf(args.at(0))).frozen = true;
    } else if (cmd == "thaw") {
      Thaw(IdOf(args.at(0)));
    } else if (cmd == "cut" || cmd == "heal") {
      Cut(args.at(0), args.at(1), cmd == "cut");
    } else if (cmd == "close") {
      Close(args.at(0), args.at(1));
    } else if (cmd == "drop") {
      drop_[{IdOf(args.at(0)), IdOf(args.at(1))}] += std::stoi(args.at(2));
    } else if (cmd == "loss") {
      loss_[{IdOf(args.at(0)), IdOf(args.at(1))}] = std::stoi(args.at(2));
    } else if (cmd == "barrier") {
      EnterBarriers(args.at(0), GroupOf(args.at(1)));
    } else if (cmd == "finalize" || cmd == "crash") {
      Leave(IdOf(args.at(0)), cmd == "finalize");
    } else if (cmd == "data") {
      Message data;
      data.meta.set_recver(IdOf(args.at(1)));
      data.meta.set_request(true);
      Send(IdOf(args.at(0)), std::move(data));
    } else if (cmd == "restart") {
      Restart(IdOf(args.at(0)));
    } else if (cmd == "inject") {
      Inject(args);
    } else if (cmd == "state") {
      State();
    } else {
      ADD_FAILURE() << "unknown command: " << line;
    }
    return out_.str();
  }

 private:
  // A message on its way, or a connection's loss noticed.
  struct Item {
    int to;
    bool lost;  // a lost connection to `from`
    int from;
    Message msg;
    int to_port = 0;  // the address it was sent to
    int from_port = 0;
  };
  struct Node {
    std::unique_ptr<NodeProtocol> protocol;
    Config config;
    int port = kFirstPort;  // its process's address
    bool alive = true;
    bool started = false;  // ticking (a restart: once it has the table)
    bool frozen = false;
    Clock::time_point next_tick;
    std::vector<Item> held;  // arrived while frozen
    struct Wait {
      int group;
      BarrierWaits::Ticket ticket;
    };
    std::vector<Wait> waits;
  };

  int64_t Ms(Clock::time_point t) const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t - start_)
        .count();
  }
  void Print(int id, const std::string& what) {
    out_ << Ms(now_) << " " << NameOf(id) << ": " << what << "\n";
  }

  void Cluster(const std::vector<std::string>& args) {
    std::map<std::string, int> opt = {
        {"servers", 1},    {"workers", 1},     {"replicas", 0},
        {"restarts", 0},   {"interval", 1000}, {"timeout", 2500},
        {"rejoin", 10000}, {"barrier", 60000}, {"connect", 10000}};
    for (const std::string& a : args) {
      const size_t eq = a.find('=');
      ASSERT_NE(eq, std::string::npos) << a;
      ASSERT_TRUE(opt.count(a.substr(0, eq))) << a;
      opt[a.substr(0, eq)] = std::stoi(a.substr(eq + 1));
    }
    Config base;
    base.num_servers = opt["servers"];
    base.num_workers = opt["workers"];
    base.replicas = opt["replicas"];
    base.max_restarts = opt["restarts"];
    base.heartbeat_interval_ms = opt["interval"];
    base.heartbeat_timeout_ms = opt["timeout"];
    base.rejoin_timeout_ms = opt["rejoin"];
    base.barrier_timeout_ms = opt["barrier"];
    base.connect_timeout_ms = opt["connect"];
    base.resend_timeout_ms = 0;  // the KV layer's, not this protocol's
    std::vector<NodeInfo> members;
    for (int r = 0; r < base.num_servers; ++r) {
      members.push_back(Info(Role::kServer, ServerRankToId(r), r));
    }
    for (int r = 0; r < base.num_workers; ++r) {
      members.push_back(Info(Role::kWorker, WorkerRankToId(r), r));
    }
    Config sched = base;
    sched.role = Role::kScheduler;
    Node& s = Add(kSchedulerId, sched);
    s.protocol->RegisterSelf(Info(Role::kScheduler, kSchedulerId, 0), now_);
    Output out;
    s.protocol->AdmitAll(members, now_, &out);
    for (const NodeInfo& n : members) {
      Config c = base;
      c.role = n.role;
      Add(n.id, c);
    }
    // The node tables arrive: each member imports it.
    for (const Message& msg : out.messages) {
      NodeTable table;
      for (const pb::NodeInfo& p : msg.meta.control().node()) {
        table.Add(FromProto(p));
      }
      nodes_.at(msg.meta.recver())
          .protocol->Import(std::move(table), {}, msg.meta.recver(), now_);
    }
    for (auto& [id, node] : nodes_) StartTicking(&node);
  }
  static NodeInfo Info(Role role, int id, int rank) {
    NodeInfo n;
    n.role = role;
    n.id = id;
    n.rank = rank;
    n.host = "10.0.0." + std::to_string(id);
    n.port = kFirstPort;
    return n;
  }
  Node& Add(int id, const Config& config) {
    Node& n = nodes_[id];
    n = Node();
    n.protocol = std::make_unique<NodeProtocol>(config);
    n.config = config;
    return n;
  }
  void StartTicking(Node* node) {
    node->started = true;
    node->protocol->Start(now_);
    node->next_tick =
        now_ + std::chrono::milliseconds(node->protocol->tick_ms());
  }

  // Advances virtual time by `ms`: every message due and every tick, in
  // order of time (messages first at equal times).
  void Run(int ms) {
    const Clock::time_point end = now_ + std::chrono::milliseconds(ms);
    for (int guard = 0; guard < 10000000; ++guard) {
      Clock::time_point next = end;
      int ticker = -1;
      for (auto& [id, node] : nodes_) {
        if (node.alive && node.started && !node.frozen &&
            node.protocol->tick_ms() > 0 && node.next_tick < next) {
          next = node.next_tick;
          ticker = id;
        }
      }
      if (!queue_.empty() && queue_.begin()->first.first <= next) {
        now_ = queue_.begin()->first.first;
        Item item = std::move(queue_.begin()->second);
        queue_.erase(queue_.begin());
        Deliver(std::move(item));
        continue;
      }
      now_ = next;
      if (ticker < 0) return;
      Node& node = nodes_.at(ticker);
      Output out;
      node.protocol->Tick(now_, &out);
      node.next_tick =
          now_ + std::chrono::milliseconds(node.protocol->tick_ms());
      Emit(ticker, &out);
    }
    ADD_FAILURE() << "run " << ms << " did not end";
  }

  void Deliver(Item item) {
    Node& node = nodes_.at(item.to);
    if (!node.alive || node.port != item.to_port) return;
    if (node.frozen) {
      if (!item.lost) node.held.push_back(std::move(item));
      return;
    }
    Output out;
    if (item.lost) {
      node.protocol->OnConnectionLost(item.from, "connection lost", now_, &out);
    } else {
      Receive(item.to, item, &out);
    }
    Emit(item.to, &out);
  }

  // As the Postoffice's OnMessage and OnControl do with a message.
  void Receive(int to, const Item& item, Output* out) {
    const Message& msg = item.msg;
    NodeProtocol& p = *nodes_.at(to).protocol;
    const pb::Command cmd = msg.meta.control().cmd();
    if (cmd == pb::ADD_NODE) return OnAddNode(to, item, out);
    // Before its node table a node knows the scheduler by its address.
    const NodeInfo* known = p.table().Find(msg.meta.sender());
    const bool proven = known != nullptr
                            ? known->port == item.from_port
                            : !p.ready() && msg.meta.sender() == kSchedulerId;
    if (!proven) {
      Print(to, "drop from " + NameOf(msg.meta.sender()) +
                    ": not from its address in the node table");
      return;
    }
    const bool fenced = p.OnProven(msg.meta.sender(), cmd, now_, out);
    if (cmd == pb::EMPTY) {
      Print(to, std::string(fenced ? "fenced" : "took") + " data from " +
                    NameOf(msg.meta.sender()));
      return;
    }
    if (!out->messages.empty()) return;
    if (NodeProtocol::Takes(cmd)) p.OnControl(msg.meta, now_, out);
  }

  // ADD_NODE: a member's report to a restarted scheduler, the node table
  // for a restarted worker, the answer to a report.
  void OnAddNode(int to, const Item& item, Output* out) {
    Node& node = nodes_.at(to);
    NodeProtocol& p = *node.protocol;
    const pb::Meta& m = item.msg.meta;
    const pb::Control& c = m.control();
    if (to == kSchedulerId && m.request() && c.rejoin()) {
      std::vector<NodeInfo> covered;
      for (const pb::NodeInfo& n : c.covered()) covered.push_back(FromProto(n));
      p.OnReport(FromProto(c.node(0)), covered, c.num_servers(),
                 c.num_workers(), false, NameOf(m.sender()), now_, out);
      return;
    }
    if (m.request()) return;
    if (!c.error().empty()) {
      Print(to, "refused: " + c.error());
      return;
    }
    if (p.ready() && c.rejoin()) return p.OnSchedulerBack(now_, out);
    NodeTable table;
    for (const pb::NodeInfo& n : c.node()) table.Add(FromProto(n));
    p.Import(std::move(table), {c.dead().begin(), c.dead().end()}, to, now_);
    if (c.rejoin()) p.set_rejoined();
    Print(to, "got the node table: ready");
    StartTicking(&node);
  }

  // What node `id`'s step asked for: printed, and its messages sent.
  void Emit(int id, Output* out) {
    static const char* const kLevels[] = {
        "info: ", "tell: ", "warning: ", "error: "};
    for (const Output::Drop& d : out->drops) {
      Print(id, "drop from " + NameOf(d.sender) + ": " + d.why);
    }
    for (int other : out->disconnect) Print(id, "disconnect " + NameOf(other));
    for (const Output::Rekey& r : out->rekey) {
      Print(id, "rekey " + NameOf(r.from) + " -> " + NameOf(r.to));
    }
    for (const NodeInfo& n : out->connect) {
      Print(id,
            "connect " + NameOf(n.id) + " at port " + std::to_string(n.port));
    }
    for (Message& msg : out->messages) Send(id, std::move(msg));
    if (out->routes_changed) Print(id, "routes changed");
    for (const Output::Line& l : out->lines) {
      Print(id, kLevels[l.level] + l.text);
    }
    for (const PeerEvent& e : out->events) Print(id, EventLine(e));
    for (Message& msg : out->after_events) Send(id, std::move(msg));
    Node& node = nodes_.at(id);
    for (auto it = node.waits.begin(); it != node.waits.end();) {
      BarrierWaits& waits = node.protocol->barrier_waits();
      if (!waits.Released(it->ticket)) {
        ++it;
        continue;
      }
      const Status st = waits.StatusOf(it->ticket);
      Print(id, "barrier " + GroupName(it->group) +
                    " done: " + (st.ok() ? "OK" : st.ToString()));
      waits.Leave(it->ticket);
      it = node.waits.erase(it);
    }
  }

  void Send(int from, Message msg) {
    msg.meta.set_sender(from);
    const int to = msg.meta.recver();
    const std::string what = Describe(msg);
    std::string fate;
    if (cut_.count({from, to}) > 0) {
      fate = " (cut)";
    } else if (auto d = drop_.find({from, to});
               d != drop_.end() && d->second > 0) {
      --d->second;
      fate = " (dropped)";
    } else if (auto it = loss_.find({from, to});
               it != loss_.end() &&
               static_cast<int>(rng_() % 100) < it->second) {
      fate = " (lost)";
    }
    if (!what.empty()) Print(from, "-> " + NameOf(to) + " " + what + fate);
    if (!fate.empty()) return;
    // To a registering restart's connection, or to the address the
    // sender's table has.
    Item item{to, false, from, std::move(msg)};
    item.from_port = nodes_.at(from).port;
    if (auto t = temp_.find(to); t != temp_.end()) {
      item.to = t->second;
      item.to_port = nodes_.at(t->second).port;
    } else if (const NodeInfo* n = nodes_.at(from).protocol->table().Find(to)) {
      item.to_port = n->port;
    } else {
      return;
    }
    Enqueue(now_ + std::chrono::milliseconds(kDelayMs), std::move(item));
  }
  void Enqueue(Clock::time_point at, Item item) {
    queue_.emplace(std::make_pair(at, seq_++), std::move(item));
  }

  // Who watches whose connection: the scheduler every member's, a member
  // the scheduler's.
  void Kill(int id) {
    nodes_.at(id).alive = false;
    for (auto& [other, node] : nodes_) {
      if (other == id || !node.alive) continue;
      if (other == kSchedulerId || id == kSchedulerId) {
        Item lost{other, true, id, Message()};
        lost.to_port = node.port;
        Enqueue(now_ + std::chrono::milliseconds(kGraceMs), std::move(lost));
      }
    }
  }

  // Each watched connection between `a` and `b` ("*": any) is reported
  // lost at both ends, after the watch's grace, as Kill's are.
  void Close(const std::string& a, const std::string& b) {
    const int x = IdOf(a);
    for (auto& [y, node] : nodes_) {
      if (y == x || (b != "*" && y != IdOf(b))) continue;
      if (x != kSchedulerId && y != kSchedulerId) continue;
      for (const auto& [from, to] : {std::pair(x, y), std::pair(y, x)}) {
        Item lost{to, true, from, Message()};
        lost.to_port = nodes_.at(to).port;
        Enqueue(now_ + std::chrono::milliseconds(kGraceMs), std::move(lost));
      }
    }
  }

  void Restart(int id) {
    Node& old = nodes_.at(id);
    ASSERT_FALSE(old.alive) << NameOf(id) << " still runs";
    const Config config = old.config;
    const int port = id == kSchedulerId ? old.port : old.port + 1;
    Node& node = Add(id, config);
    node.port = port;
    NodeInfo me = Info(config.role, id, IdToRank(id));
    me.port = port;
    if (id == kSchedulerId) {
      // It binds the old one's address and learns the job from the
      // members' reports.
      node.protocol->RegisterSelf(me, now_);
      StartTicking(&node);
      return;
    }
    // A worker registers with the scheduler as the restart of its rank.
    me.id = kFirstTempId + static_cast<int>(temp_.size());
    me.requested_rank = IdToRank(id);
    me.rank = -1;
    temp_[me.id] = id;
    NodeProtocol& sched = *nodes_.at(kSchedulerId).protocol;
    Print(kSchedulerId, "a restart of " + NameOf(id) + " registers");
    const Status st = sched.CheckRestart(me);
    if (!st.ok()) {
      Print(kSchedulerId, "refused: " + st.message());
      return;
    }
    Output out;
    bool started = false;
    sched.RegisterRestart(me, now_, &started, &out);
    Emit(kSchedulerId, &out);
  }

  void Thaw(int id) {
    Node& node = nodes_.at(id);
    node.frozen = false;
    // It runs again: its timer fires at once, late; then what waited.
    Output out;
    node.protocol->Tick(now_, &out);
    node.next_tick = now_ + std::chrono::milliseconds(node.protocol->tick_ms());
    Emit(id, &out);
    std::vector<Item> held;
    held.swap(node.held);
    for (const Item& item : held) {
      Output o;
      Receive(id, item, &o);
      Emit(id, &o);
    }
  }

  void Cut(const std::string& a, const std::string& b, bool cut) {
    std::vector<int> others;
    if (b == "*") {
      for (const auto& [id, node] : nodes_) others.push_back(id);
    } else {
      others.push_back(IdOf(b));
    }
    const int x = IdOf(a);
    for (int y : others) {
      if (y == x) continue;
      if (cut) {
        cut_.insert({x, y});
        cut_.insert({y, x});
      } else {
        cut_.erase({x, y});
        cut_.erase({y, x});
      }
    }
  }

  void EnterBarriers(const std::string& list, int group) {
    std::stringstream names(list);
    for (std::string name; std::getline(names, name, ',');) {
      const int id = IdOf(name);
      Node& node = nodes_.at(id);
      Output out;
      node.waits.push_back(
          {group, node.protocol->EnterBarrier(group, now_, &out)});
      Emit(id, &out);
    }
  }

  void Leave(int id, bool clean) {
    Node& node = nodes_.at(id);
    node.protocol->set_finalized();
    Message bye =
        NodeProtocol::ControlMessage(pb::TERMINATE, kSchedulerId, true);
    if (!clean) {
      bye.meta.mutable_control()->set_error(
          "it stopped without Finalize (its process exited or failed)");
    }
    Send(id, std::move(bye));
    // Its process ends after the goodbye: the connection drops.
    Kill(id);
  }

  void Inject(const std::vector<std::string>& args) {
    ASSERT_GE(args.size(), 5u);
    ASSERT_EQ(args[2], "node_failed");
    Message msg =
        NodeProtocol::ControlMessage(pb::NODE_FAILED, IdOf(args[1]), false);
    pb::Control* c = msg.meta.mutable_control();
    const NodeInfo* dead =
        nodes_.at(IdOf(args[1])).protocol->table().Find(IdOf(args[3]));
    ASSERT_NE(dead, nullptr);
    ToProto(*dead, c->add_node());
    c->set_error("injected");
    const std::string& v = args[4];
    c->set_verdict(v == "lose"    ? pb::LOSE
                   : v == "await" ? pb::AWAIT
                   : v == "cover" ? pb::COVER
                                  : pb::VERDICT_UNSET);
    if (args.size() > 5) c->set_covered_by(IdOf(args[5]));
    Send(IdOf(args[0]), std::move(msg));
  }

  void State() {
    for (const auto& [id, node] : nodes_) {
      if (!node.alive) {
        out_ << NameOf(id) << ": (stopped)\n";
        continue;
      }
      const NodeProtocol& p = *node.protocol;
      if (!p.ready()) {
        out_ << NameOf(id) << ": (registering)\n";
        continue;
      }
      out_ << NameOf(id) << (node.frozen ? " (frozen)" : "") << ":";
      for (const auto& [other, info] : p.table().nodes()) {
        out_ << " " << NameOf(other) << "="
             << PeerStateName(p.membership().state(other));
      }
      if (!p.peer_failure().ok()) out_ << " | " << p.peer_failure().ToString();
      out_ << "\n";
    }
  }

  Clock::time_point start_ = Clock::time_point() + std::chrono::hours(1);
  Clock::time_point now_ = start_;
  std::map<int, Node> nodes_;
  std::multimap<std::pair<Clock::time_point, uint64_t>, Item> queue_;
  uint64_t seq_ = 0;
  std::set<std::pair<int, int>> cut_;
  std::map<std::pair<int, int>, int> loss_;
  std::map<std::pair<int, int>, int> drop_;
  std::map<int, int> temp_;  // a registering restart's id -> its node
  std::mt19937_64 rng_{42};
  std::ostringstream out_;
};

// ---- The scenario files ----------------------------------------------------

struct Step {
  std::string command;
  std::string expected;
};

// Comments (#) and blank lines between steps are kept as they are when the
// file is written again.
struct Scenario {
  std::vector<std::string> preambles;  // before each step
  std::vector<Step> steps;
};

Scenario Parse(const std::string& text) {
  Scenario s;
  std::istringstream in(text);
  std::string line, preamble;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') {
      preamble += line + "\n";
      continue;
    }
    Step step{line, ""};
    std::getline(in, line);
    EXPECT_EQ(line, "----") << "after " << step.command;
    while (std::getline(in, line) && !line.empty()) {
      step.expected += line + "\n";
    }
    s.preambles.push_back(preamble);
    s.steps.push_back(step);
    preamble.clear();
  }
  return s;
}

std::vector<std::string> ScenarioFiles() {
  std::vector<std::string> files;
  for (const auto& entry :
       std::filesystem::directory_iterator(PS_SCENARIO_DIR)) {
    if (entry.path().extension() == ".txt") {
      files.push_back(entry.path().stem().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

class Scenarios : public ::testing::TestWithParam<std::string> {};

TEST_P(Scenarios, GiveTheirGoldenOutput) {
  const std::string path =
      std::string(PS_SCENARIO_DIR) + "/" + GetParam() + ".txt";
  std::ifstream file(path);
  ASSERT_TRUE(file) << path;
  std::stringstream text;
  text << file.rdbuf();
  Scenario scenario = Parse(text.str());
  ASSERT_FALSE(scenario.steps.empty()) << path;
  const bool update = std::getenv("PS_UPDATE_GOLDEN") != nullptr;
  FLAGS_minloglevel = google::GLOG_WARNING;  // the transitions' INFO lines
  Sim sim;
  std::string written;
  for (size_t i = 0; i < scenario.steps.size(); ++i) {
    const Step& step = scenario.steps[i];
    std::string got = sim.Do(step.command);
    if (got.empty()) got = "(nothing)\n";
    if (update) {
      written += scenario.preambles[i] + step.command + "\n----\n" + got + "\n";
    } else {
      EXPECT_EQ(got, step.expected)
          << path << ": step " << i + 1 << ": " << step.command;
    }
  }
  if (update) {
    while (!written.empty() && written.back() == '\n') written.pop_back();
    std::ofstream(path) << written << "\n";
  }
}

INSTANTIATE_TEST_SUITE_P(ProtocolSim, Scenarios,
                         ::testing::ValuesIn(ScenarioFiles()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string name = p.param;
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) {
                               c = '_';
                             }
                           }
                           return name;
                         });

}  // namespace
}  // namespace core
}  // namespace ps
