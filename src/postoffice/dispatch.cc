// Postoffice, continued: data messages to the KV layer's customers (their
// mailboxes, requests held for a KVServer not registered yet) and the
// customer registry.
#include <algorithm>
#include <utility>

#include "kv/replica_chain.h"
#include "postoffice/postoffice.h"

namespace ps {

void Postoffice::DispatchData(Message&& msg) {
  if (msg.meta.simple_app()) {
    DispatchSimpleApp(std::move(msg));
    return;
  }
  const int sender = msg.meta.sender();
  // Replication: a push a primary forwards to its replica (for a worker),
  // and the replica's answer; both for the server's KV layer.
  const bool replica_traffic =
      config_.replicas > 0 && config_.role == Role::kServer &&
      IsServerId(sender) && msg.meta.has_origin() &&
      IsWorkerId(msg.meta.origin()) &&
      detail::IsReplicaTraffic(msg.meta.request(), IdToRank(sender), rank(),
                               config_.num_servers);
  bool request = msg.meta.request();
  bool ok_role =
      replica_traffic ||
      (request ? config_.role == Role::kServer && IsWorkerId(sender)
               : config_.role == Role::kWorker && IsServerId(sender));
  if (!ok_role) {
    CountDropped(sender, std::string("a ") + RoleName(config_.role) +
                             " does not take " + DebugString(msg));
    return;
  }
  if (replica_traffic) request = true;  // to the KVServer, either way
  CustomerKey key{request, msg.meta.app_id(),
                  request ? -1 : msg.meta.customer_id()};
  const Clock::time_point now = Clock::now();
  if (request) ExpireHeldRequests(now);
  std::shared_ptr<Customer> customer;
  {
    MutexLock lock(&customers_mu_);
    auto it = customers_.find(key);
    if (it == customers_.end()) {
      // Requests may come before the server set its request handle (a
      // worker may learn of the start barrier's end first): hold them, for
      // PS_CONNECT_TIMEOUT_MS at most (ExpireHeldRequests).
      // Up to a count and PS_MAX_MESSAGE_BYTES in all. A resent copy of
      // one held already is let go (it would count twice).
      if (request && held_.count(key) > 0) {
        const pb::Meta& m = msg.meta;
        for (const HeldRequest& h : held_[key]) {
          if (h.msg.meta.sender() == m.sender() &&
              h.msg.meta.customer_id() == m.customer_id() &&
              h.msg.meta.timestamp() == m.timestamp() &&
              h.msg.meta.origin() == m.origin()) {
            CountDuplicate();
            return;
          }
        }
      }
      if (request && held_count_ < kMaxEarlyMessages &&
          held_bytes_ + MessageBytes(msg) <=
              static_cast<uint64_t>(config_.max_message_bytes)) {
        held_bytes_ += MessageBytes(msg);
        held_[key].push_back({std::move(msg), now});
        ++held_count_;
        return;
      }
    } else {
      customer = it->second;
      customer->mailbox.push_back(std::move(msg));
      if (customer->delivering) return;  // its deliverer drains the mailbox
      customer->delivering = true;
    }
  }
  if (customer == nullptr && msg.meta.request()) {
    // Too many early requests held already: refused now, not lost.
    RefuseRequest(msg, Status::kUnavailable,
                  "server " + std::to_string(rank()) +
                      " holds too many requests for apps without a KVServer "
                      "yet (app " +
                      std::to_string(msg.meta.app_id()) + ")");
    return;
  }
  if (customer == nullptr) {
    CountDropped(msg.meta.sender(),
                 "no customer for app " + std::to_string(msg.meta.app_id()) +
                     " customer " + std::to_string(msg.meta.customer_id()));
    return;
  }
  Deliver(customer);
}

void Postoffice::DispatchSimpleApp(Message&& msg) {
  // Any member may talk to any other (the sender is proven already).
  CustomerKey key{false, msg.meta.app_id(),
                  SimpleAppCustomerId(msg.meta.customer_id())};
  std::shared_ptr<Customer> customer;
  {
    MutexLock lock(&customers_mu_);
    auto it = customers_.find(key);
    if (it != customers_.end()) {
      customer = it->second;
      customer->mailbox.push_back(std::move(msg));
      if (customer->delivering) return;
      customer->delivering = true;
    }
  }
  if (customer == nullptr) {
    CountDropped(msg.meta.sender(),
                 "no SimpleApp for app " + std::to_string(msg.meta.app_id()) +
                     " customer " + std::to_string(msg.meta.customer_id()));
    return;
  }
  Deliver(customer);
}

void Postoffice::ExpireHeldRequests(Clock::time_point now) {
  const auto max_age = std::chrono::milliseconds(config_.connect_timeout_ms);
  std::vector<Message> expired;
  {
    MutexLock lock(&customers_mu_);
    if (held_count_ == 0) return;
    for (auto it = held_.begin(); it != held_.end();) {
      std::vector<HeldRequest>& held = it->second;
      auto young = std::find_if(held.begin(), held.end(), [&](const auto& h) {
        return now - h.since <= max_age;
      });  // held in order of arrival
      for (auto h = held.begin(); h != young; ++h) {
        held_bytes_ -= MessageBytes(h->msg);
        expired.push_back(std::move(h->msg));
      }
      held_count_ -= young - held.begin();
      held.erase(held.begin(), young);
      it = held.empty() ? held_.erase(it) : std::next(it);
    }
  }
  if (expired.empty()) return;
  const int my_rank = rank();
  for (const Message& req : expired) {
    RefuseRequest(req, Status::kNotFound,
                  "no KVServer for app " + std::to_string(req.meta.app_id()) +
                      " on server " + std::to_string(my_rank) + " within " +
                      std::to_string(config_.connect_timeout_ms) +
                      " ms (PS_CONNECT_TIMEOUT_MS)");
  }
}

void Postoffice::RefuseRequest(const Message& req, Status::Code code,
                               const std::string& why) {
  const pb::Meta& q = req.meta;
  CountDropped(q.sender(), why);
  Message answer;
  pb::Meta& m = answer.meta;
  m.set_app_id(q.app_id());
  m.set_customer_id(q.customer_id());
  m.set_timestamp(q.timestamp());
  m.set_request(false);
  m.set_push(q.push());
  m.set_pull(q.pull());
  m.set_head(q.head());
  m.set_recver(q.sender());
  if (q.has_shard()) m.set_shard(q.shard());
  if (q.has_origin()) m.set_origin(q.origin());
  m.mutable_control()->set_error(why);
  m.mutable_control()->set_error_code(code);
  Status st = Send(&answer);
  if (!st.ok()) LOG(WARNING) << "refusing " << DebugString(req) << ": " << st;
}

std::vector<std::shared_ptr<Postoffice::Customer>> Postoffice::Customers() {
  std::vector<std::shared_ptr<Customer>> customers;
  MutexLock lock(&customers_mu_);
  for (auto& [key, c] : customers_) customers.push_back(c);
  return customers;
}

void Postoffice::Deliver(const std::shared_ptr<Customer>& customer) {
  MutexLock lock(&customers_mu_);
  customer->deliverer = std::this_thread::get_id();
  while (!customer->mailbox.empty()) {
    Message msg = std::move(customer->mailbox.front());
    customer->mailbox.pop_front();
    lock.Unlock();
    customer->on_data(std::move(msg));
    lock.Lock();
  }
  customer->delivering = false;
  customer->deliverer = std::thread::id();
  customers_cv_.SignalAll();
}

void Postoffice::RegisterCustomer(bool requests, int app_id, int customer_id,
                                  DataHandler on_data,
                                  FailureHandler on_failure,
                                  TickHandler on_tick, JoinHandler on_join) {
  auto customer = std::make_shared<Customer>();
  customer->on_data = std::move(on_data);
  customer->on_failure = std::move(on_failure);
  customer->on_tick = std::move(on_tick);
  customer->on_join = std::move(on_join);
  {
    MutexLock lock(&customers_mu_);
    CustomerKey key{requests, app_id, requests ? -1 : customer_id};
    CHECK(customers_.count(key) == 0)
        << "app " << app_id << " customer " << customer_id
        << " is registered twice on one node";
    customers_[key] = customer;
    auto held = held_.find(key);
    if (held == held_.end()) return;
    for (HeldRequest& h : held->second) {
      held_bytes_ -= MessageBytes(h.msg);
      customer->mailbox.push_back(std::move(h.msg));
    }
    held_count_ -= held->second.size();
    held_.erase(held);
    customer->delivering = true;
  }
  Deliver(customer);  // the held requests, on this thread, in order
}

void Postoffice::TickCustomers(Clock::time_point now) {
  std::vector<std::shared_ptr<Customer>> ticked;
  {
    MutexLock lock(&customers_mu_);
    for (const auto& [key, customer] : customers_) {
      if (customer->on_tick) ticked.push_back(customer);
    }
  }
  // A customer unregistered meanwhile is kept off by its own gate.
  for (const auto& customer : ticked) customer->on_tick(now);
}

void Postoffice::UnregisterCustomer(bool requests, int app_id,
                                    int customer_id) {
  MutexLock lock(&customers_mu_);
  CustomerKey key{requests, app_id, requests ? -1 : customer_id};
  auto it = customers_.find(key);
  if (it == customers_.end()) return;
  std::shared_ptr<Customer> customer = it->second;
  customers_.erase(it);
  if (customer->deliverer == std::this_thread::get_id()) return;
  while (customer->delivering) customers_cv_.Wait();
}

}  // namespace ps
