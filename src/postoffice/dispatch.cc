// Postoffice, continued: data messages to the KV layer's customers (their
// mailboxes, requests held for a KVServer not registered yet) and the
// customer registry.
#include <algorithm>
#include <utility>

#include "postoffice/postoffice.h"

namespace ps {

bool Postoffice::FastDispatch(Message* msg) {
  if (msg->meta.control().cmd() != pb::EMPTY) return false;
  const std::shared_ptr<const Routes> routes = routes_.Load();
  const int sender = msg->meta.sender();
  // The scheduler's messages go the slow way: they are its heartbeats too.
  if (!routes->ready || sender == kSchedulerId || sender == routes->my_id) {
    return false;
  }
  const NodeInfo* claimed = routes->table.Find(sender);
  if (claimed == nullptr || !claimed->HasIdentity(msg->from) ||
      routes->IsDown(sender)) {
    return false;  // the slow path says why, under mu_
  }
  if (DropForTest(*msg)) return true;
  DispatchData(std::move(*msg));
  return true;
}

Postoffice::CustomerKey Postoffice::CustomerOf(const pb::Meta& m) const {
  if (m.simple_app()) {
    // ps-lite's rule: on a worker, the customer the message names; on a
    // server or the scheduler, the app's (customer app_id).
    const int c = config_.role == Role::kWorker ? m.customer_id() : m.app_id();
    return {false, m.app_id(), SimpleAppCustomerId(c)};
  }
  // A server gets requests, and the answers to what it forwarded on
  // behalf of another node (`origin`: a push copied to its replica).
  const bool to_server =
      m.request() || (config_.role == Role::kServer && m.has_origin());
  return {to_server, m.app_id(), to_server ? -1 : m.customer_id()};
}

void Postoffice::DispatchData(Message&& msg) {
  // On arrival, before any handler: the round trip it measures is the
  // network's and the receive thread's only.
  if (TakeAck(msg)) return;
  const CustomerKey key = CustomerOf(msg.meta);
  // Servers serve, workers ask; the scheduler's data is SimpleApp's only.
  // Which peer may ask or answer what is the KV layer's to check.
  if (!msg.meta.simple_app() &&
      std::get<0>(key) != (config_.role == Role::kServer)) {
    CountDropped(msg.meta.sender(), std::string("a ") + RoleName(config_.role) +
                                        " does not take " + DebugString(msg));
    return;
  }
  const std::shared_ptr<const CustomerMap> customers = LoadCustomers();
  auto it = customers->find(key);
  if (it != customers->end() && Post(it->second, &msg)) return;
  HoldOrDrop(key, std::move(msg));
}

bool Postoffice::Post(const std::shared_ptr<Customer>& customer, Message* msg) {
  {
    MutexLock lock(&customer->mu);
    if (customer->closed) return false;
    if (customer->paused && msg->meta.request()) {
      customer->waiting.push_back(std::move(*msg));  // for ResumeCustomer
      return true;
    }
    customer->mailbox.push_back(std::move(*msg));
    if (customer->delivering) return true;  // its deliverer drains it
    customer->delivering = true;
  }
  Deliver(customer);
  return true;
}

// What takes msg's requests on this node, for the lines that refuse them:
// "KVServer for app 0 on server 1", "SimpleApp 0 (customer 0) on worker 2".
std::string Postoffice::TakerOf(const pb::Meta& m) const {
  const std::string app = std::to_string(m.app_id());
  return (m.simple_app() ? "SimpleApp " + app + " (customer " +
                               std::to_string(m.customer_id()) + ")"
                         : "KVServer for app " + app) +
         " on " +
         (IsScheduler() ? std::string("the scheduler")
                        : std::string(RoleName(config_.role)) + " " +
                              std::to_string(rank()));
}

void Postoffice::HoldOrDrop(const CustomerKey& key, Message&& msg) {
  // KV requests to a server and SimpleApp requests to any node.
  const bool request =
      (std::get<0>(key) || msg.meta.simple_app()) && msg.meta.request();
  const Clock::time_point now = Clock::now();
  if (request) ExpireHeldRequests(now);
  std::shared_ptr<Customer> customer;
  {
    MutexLock lock(&customers_mu_);
    // Registered since the look-up?
    const std::shared_ptr<const CustomerMap> customers = LoadCustomers();
    auto it = customers->find(key);
    if (it != customers->end()) {
      customer = it->second;
    } else if (request) {
      // Requests may come before the server set its request handle (a
      // worker may learn of the start barrier's end first), or before the
      // receiver made its SimpleApp (ps-lite programs make it after
      // ps::Start): held.
      if (HoldLocked(key, &msg, now)) return;
    }
  }
  if (customer != nullptr && Post(customer, &msg)) return;
  if (request) {
    // Unregistered in the instant since the look-up (it is being
    // destroyed), or too many early requests held already: refused now,
    // not lost.
    RefuseRequest(msg, Status::kUnavailable,
                  customer != nullptr
                      ? "the " + TakerOf(msg.meta) + " is closing"
                      : "no " + TakerOf(msg.meta) +
                            " yet, and this node holds too many requests for "
                            "apps not made yet (" +
                            std::to_string(held_count_.load()) +
                            " held; at most " +
                            std::to_string(kMaxEarlyMessages) + ", and " +
                            std::to_string(config_.max_message_bytes) +
                            " bytes in all, PS_MAX_MESSAGE_BYTES)");
    return;
  }
  if (msg.meta.attempt() > 1) {
    // A resent answer (its first copy's acknowledgement was late, or lost)
    // for a customer gone since: the first copy came, or nobody waits for
    // it any more. Let go as the duplicate it is, not counted as dropped.
    CountDuplicate();
    return;
  }
  CountDropped(
      msg.meta.sender(),
      std::string(msg.meta.simple_app() ? "no SimpleApp" : "no customer") +
          " for app " + std::to_string(msg.meta.app_id()) + " customer " +
          std::to_string(msg.meta.customer_id()));
}

bool Postoffice::HoldLocked(const CustomerKey& key, Message* msg,
                            Clock::time_point now) {
  // For PS_CONNECT_TIMEOUT_MS at most (ExpireHeldRequests), up to a count
  // and PS_MAX_MESSAGE_BYTES in all. A resent copy of one held already is
  // let go (it would count twice).
  const pb::Meta& m = msg->meta;
  auto held = held_.find(key);
  if (held != held_.end()) {
    for (const HeldRequest& h : held->second) {
      if (h.msg.meta.sender() == m.sender() &&
          h.msg.meta.customer_id() == m.customer_id() &&
          h.msg.meta.timestamp() == m.timestamp() &&
          h.msg.meta.origin() == m.origin()) {
        CountDuplicate();
        return true;
      }
    }
  }
  const uint64_t bytes = MessageBytes(*msg);
  if (held_count_.load() >= kMaxEarlyMessages ||
      held_bytes_ + bytes > static_cast<uint64_t>(config_.max_message_bytes)) {
    return false;
  }
  held_bytes_ += bytes;
  held_[key].push_back({std::move(*msg), now});
  held_count_.fetch_add(1);
  return true;
}

void Postoffice::ExpireHeldRequests(Clock::time_point now) {
  const auto max_age = std::chrono::milliseconds(config_.connect_timeout_ms);
  if (held_count_.load() == 0) return;  // no lock on the data path
  std::vector<Message> expired;
  {
    MutexLock lock(&customers_mu_);
    for (auto it = held_.begin(); it != held_.end();) {
      std::vector<HeldRequest>& held = it->second;
      auto young = std::find_if(held.begin(), held.end(), [&](const auto& h) {
        return now - h.since <= max_age;
      });  // held in order of arrival
      for (auto h = held.begin(); h != young; ++h) {
        held_bytes_ -= MessageBytes(h->msg);
        expired.push_back(std::move(h->msg));
      }
      held_count_.fetch_sub(young - held.begin());
      held.erase(held.begin(), young);
      it = held.empty() ? held_.erase(it) : std::next(it);
    }
  }
  if (expired.empty()) return;
  for (const Message& req : expired) {
    RefuseRequest(req, Status::kNotFound,
                  "no " + TakerOf(req.meta) + " within " +
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
  m.set_simple_app(q.simple_app());
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
  // Held in a local: a range-for over *LoadCustomers() would outlive it.
  const std::shared_ptr<const CustomerMap> registry = LoadCustomers();
  for (const auto& [key, c] : *registry) customers.push_back(c);
  return customers;
}

void Postoffice::Deliver(const std::shared_ptr<Customer>& customer) {
  MutexLock lock(&customer->mu);
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
  customer->cv.SignalAll();
}

void Postoffice::RegisterCustomer(bool requests, int app_id, int customer_id,
                                  DataHandler on_data, EventHandler on_event,
                                  TickHandler on_tick, bool paused) {
  auto customer = std::make_shared<Customer>();
  customer->on_data = std::move(on_data);
  customer->on_event = std::move(on_event);
  customer->on_tick = std::move(on_tick);
  bool drain = false;
  {
    MutexLock lock(&customers_mu_);
    CustomerKey key{requests, app_id, requests ? -1 : customer_id};
    // Held until the held requests are in its mailbox: a message that
    // finds it in the new snapshot meanwhile queues behind them.
    MutexLock customer_lock(&customer->mu);
    customer->paused = paused;
    customers_.Update([&](CustomerMap& customers) {
      CHECK(customers.count(key) == 0)
          << "app " << app_id << " customer " << customer_id
          << " is registered twice on one node";
      customers[key] = customer;
    });
    auto held = held_.find(key);
    if (held != held_.end()) {
      for (HeldRequest& h : held->second) {
        held_bytes_ -= MessageBytes(h.msg);
        (paused ? customer->waiting : customer->mailbox)
            .push_back(std::move(h.msg));
      }
      held_count_.fetch_sub(held->second.size());
      held_.erase(held);
      customer->delivering = drain = !paused;
    }
  }
  if (drain) Deliver(customer);  // the held requests, on this thread, in order
}

void Postoffice::ResumeCustomer(bool requests, int app_id, int customer_id) {
  const CustomerKey key{requests, app_id, requests ? -1 : customer_id};
  const std::shared_ptr<const CustomerMap> customers = LoadCustomers();
  auto it = customers->find(key);
  if (it == customers->end()) return;
  const std::shared_ptr<Customer>& customer = it->second;
  {
    MutexLock lock(&customer->mu);
    if (!customer->paused) return;
    customer->paused = false;
    for (Message& msg : customer->waiting) {
      customer->mailbox.push_back(std::move(msg));
    }
    customer->waiting.clear();
    if (customer->delivering || customer->mailbox.empty()) return;
    customer->delivering = true;
  }
  Deliver(customer);  // what waited, on this thread, in order
}

void Postoffice::TickCustomers(Clock::time_point now) {
  // A customer unregistered meanwhile is kept off by its own gate.
  const std::shared_ptr<const CustomerMap> registry = LoadCustomers();
  for (const auto& [key, customer] : *registry) {
    if (customer->on_tick) customer->on_tick(now);
  }
}

void Postoffice::UnregisterCustomer(bool requests, int app_id,
                                    int customer_id) {
  std::shared_ptr<Customer> customer;
  {
    MutexLock lock(&customers_mu_);
    CustomerKey key{requests, app_id, requests ? -1 : customer_id};
    customer = customers_.Update([&](CustomerMap& customers) {
      std::shared_ptr<Customer> found;
      auto it = customers.find(key);
      if (it == customers.end()) return found;
      found = it->second;
      customers.erase(it);
      return found;
    });
  }
  if (customer == nullptr) return;
  MutexLock lock(&customer->mu);
  customer->closed = true;  // to a sender that found it in an older snapshot
  if (!customer->waiting.empty()) {
    // Gone while paused: the requests that waited for it are refused, not
    // left unanswered.
    std::deque<Message> waiting;
    waiting.swap(customer->waiting);
    lock.Unlock();
    for (const Message& msg : waiting) {
      RefuseRequest(msg, Status::kUnavailable,
                    "the " + TakerOf(msg.meta) +
                        " was destroyed before it took this request");
    }
    lock.Lock();
  }
  if (customer->deliverer == std::this_thread::get_id()) return;
  while (customer->delivering) customer->cv.Wait();
}

}  // namespace ps
