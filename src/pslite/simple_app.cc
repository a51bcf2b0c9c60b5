// SimpleApp over the node's postoffice: messages with meta.simple_app set,
// routed to the customer (app_id, customer_id) of the receiving node.
#include "ps/simple_app.h"

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "kv/call_gate.h"
#include "postoffice/postoffice.h"
#include "van/message.h"

namespace ps {

class SimpleApp::Impl {
 public:
  Impl(SimpleApp* app, Node* node, int app_id, int customer_id)
      : app_(app),
        node_(node),
        app_id_(app_id),
        customer_id_(customer_id),
        // ps-lite's rule: a worker's messages go to the customer they name,
        // a server's or the scheduler's to the app's (customer app_id).
        key_(Postoffice::SimpleAppCustomerId(
            node->role() == Role::kWorker ? customer_id : app_id)) {
    request_handle_ = [](const SimpleData& req, SimpleApp* a) {
      a->Response(req);
    };
    response_handle_ = [](const SimpleData&, SimpleApp*) {};
    // Paused: a program sets its request handle after making the app
    // (ps-lite's form), and requests may be here already (a peer's app was
    // made first). They wait for the request handle, or kGrace.
    node_->postoffice()->RegisterCustomer(
        false, app_id_, key_, [this](Message&& msg) { OnMessage(msg); },
        [this, gate = gate_](const core::PeerEvent& e) {
          if (e.kind == core::PeerEvent::kPeerRejoined) return;
          gate->Call([&] { OnFailure(e.id, e.Told()); });
        },
        nullptr, /*paused=*/true);
    grace_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(grace_mu_);
      if (!grace_cv_.wait_for(lock, kGrace,
                              [this] { return resumed_ || closing_; })) {
        lock.unlock();
        Resume();  // no request handle came: the default one answers
      }
    });
  }
  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(grace_mu_);
      closing_ = true;
    }
    grace_cv_.notify_all();
    grace_.join();
    gate_->Close();
    node_->postoffice()->UnregisterCustomer(false, app_id_, key_);
  }

  // Hands the app the requests that waited for it, on this thread (once).
  void Resume() {
    {
      std::lock_guard<std::mutex> lock(grace_mu_);
      resumed_ = true;
    }
    grace_cv_.notify_all();
    node_->postoffice()->ResumeCustomer(false, app_id_, key_);
  }

  int Request(int head, const std::string& body, int recv_id) {
    // An id of 8 or more names one server or worker; below, a group.
    std::vector<int> recvers =
        recv_id >= 8 ? std::vector<int>{recv_id} : node_->GetNodeIds(recv_id);
    CHECK(!recvers.empty()) << "no node has id " << recv_id;
    int ts;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ts = next_timestamp_++;
      pending_[ts] = Pending{recvers, 0};
    }
    for (int r : recvers) {
      if (r == node_->id()) {
        OnData(SimpleData{head, body, r, ts, customer_id_}, true);
        continue;
      }
      Message msg = Build(head, body, ts, true, r, customer_id_);
      Status st = node_->postoffice()->Send(&msg);
      if (!st.ok()) {
        LOG(ERROR) << "SimpleApp request to " << node_->DescribeNode(r) << ": "
                   << st;
        Answered(ts);
      }
    }
    return ts;
  }

  void Wait(int ts) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] {
      auto it = pending_.find(ts);
      return it == pending_.end() ||
             it->second.answered >= it->second.recvers.size();
    });
    pending_.erase(ts);
  }

  void Response(const SimpleData& req, const std::string& body) {
    if (req.sender == node_->id()) {
      OnData(SimpleData{req.head, body, req.sender, req.timestamp,
                        req.customer_id},
             false);
      return;
    }
    // To the app that asked: its customer id, as ps-lite routes it.
    Message msg = Build(req.head, body, req.timestamp, false, req.sender,
                        req.customer_id);
    Status st = node_->postoffice()->Send(&msg);
    if (!st.ok()) {
      LOG(ERROR) << "SimpleApp response to " << node_->DescribeNode(req.sender)
                 << ": " << st;
    }
  }

  void SetHandles(const Handle* request, const Handle* response) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (request != nullptr) request_handle_ = *request;
      if (response != nullptr) response_handle_ = *response;
    }
    if (request != nullptr) Resume();
  }

 private:
  struct Pending {
    std::vector<int> recvers;
    size_t answered = 0;
  };

  Message Build(int head, const std::string& body, int ts, bool request,
                int recver, int customer_id) const {
    Message msg;
    msg.meta.set_head(head);
    msg.meta.set_body(body);
    msg.meta.set_timestamp(ts);
    msg.meta.set_request(request);
    msg.meta.set_simple_app(true);
    msg.meta.set_app_id(app_id_);
    msg.meta.set_customer_id(customer_id);
    msg.meta.set_recver(recver);
    return msg;
  }

  void OnMessage(const Message& msg) {
    if (!msg.meta.request() && msg.meta.has_control() &&
        !msg.meta.control().error().empty()) {
      // The receiver refused the request (no SimpleApp there in time).
      LOG(ERROR) << "SimpleApp request " << msg.meta.timestamp() << " to "
                 << node_->DescribeNode(msg.meta.sender())
                 << " refused: " << msg.meta.control().error();
      Answered(msg.meta.timestamp());
      return;
    }
    OnData(SimpleData{msg.meta.head(), msg.meta.body(), msg.meta.sender(),
                      msg.meta.timestamp(), msg.meta.customer_id()},
           msg.meta.request());
  }

  // Runs a handle (never under mu_); a response also counts as an answer.
  void OnData(const SimpleData& data, bool request) {
    Handle handle;
    {
      std::lock_guard<std::mutex> lock(mu_);
      handle = request ? request_handle_ : response_handle_;
    }
    handle(data, app_);
    if (!request) Answered(data.timestamp);
  }

  void Answered(int ts) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(ts);
    if (it != pending_.end()) ++it->second.answered;
    cv_.notify_all();
  }

  // A dead receiver will not answer: count it as answered, saying so.
  void OnFailure(int id, const Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [ts, p] : pending_) {
      for (int r : p.recvers) {
        if (r == id || id == -1) {
          LOG(ERROR) << "SimpleApp request " << ts << " to "
                     << node_->DescribeNode(r) << " gets no answer: " << why;
          ++p.answered;
        }
      }
    }
    cv_.notify_all();
  }

  // How long requests that came first wait for the request handle.
  static constexpr std::chrono::milliseconds kGrace{1000};

  SimpleApp* const app_;
  Node* const node_;  // outlives this app
  const int app_id_;
  const int customer_id_;
  const int key_;  // the customer id it is registered under
  // Keeps failure notices off a destroyed app.
  const std::shared_ptr<CallGate> gate_ = std::make_shared<CallGate>();
  std::mutex grace_mu_;
  std::condition_variable grace_cv_;
  bool resumed_ = false;  // guarded by grace_mu_
  bool closing_ = false;  // guarded by grace_mu_
  std::thread grace_;     // resumes the app after kGrace
  std::mutex mu_;
  std::condition_variable cv_;
  Handle request_handle_;   // guarded by mu_
  Handle response_handle_;  // guarded by mu_
  int next_timestamp_ = 0;
  std::map<int, Pending> pending_;
};

SimpleApp::SimpleApp(int app_id) : SimpleApp(DefaultNode(), app_id, app_id) {}

SimpleApp::SimpleApp(int app_id, int customer_id)
    : SimpleApp(CustomerNode(customer_id), app_id, customer_id) {}

SimpleApp::SimpleApp(Node* node, int app_id, int customer_id)
    : impl_(std::make_unique<Impl>(this, node, app_id, customer_id)) {}

SimpleApp::~SimpleApp() = default;

int SimpleApp::Request(int req_head, const std::string& req_body, int recv_id) {
  return impl_->Request(req_head, req_body, recv_id);
}

void SimpleApp::Wait(int timestamp) { impl_->Wait(timestamp); }

void SimpleApp::Response(const SimpleData& recv_req,
                         const std::string& res_body) {
  impl_->Response(recv_req, res_body);
}

void SimpleApp::set_request_handle(const Handle& request_handle) {
  CHECK(request_handle) << "invalid request handle";
  impl_->SetHandles(&request_handle, nullptr);
}

void SimpleApp::set_response_handle(const Handle& response_handle) {
  CHECK(response_handle) << "invalid response handle";
  impl_->SetHandles(nullptr, &response_handle);
}

}  // namespace ps
