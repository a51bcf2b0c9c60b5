// ps::Node: the public face of a Postoffice.
#include "ps/node.h"

#include "postoffice/logging.h"
#include "postoffice/postoffice.h"

namespace ps {

Node::Node(const Config& config)
    : postoffice_(std::make_unique<Postoffice>(config)) {}

Node::~Node() { postoffice_->Stop(); }

Status Node::Bind() { return postoffice_->Bind(); }

Status Node::Start() {
  DefaultLogsToStderr();  // the program has parsed its flags by now
  Status st = postoffice_->Start();
  if (!st.ok()) postoffice_->Stop();
  return st;
}

Status Node::Barrier(int group) { return postoffice_->Barrier(group); }
Status Node::Finalize(bool do_barrier) {
  return postoffice_->Finalize(do_barrier);
}
void Node::Stop() { postoffice_->Stop(); }

const Config& Node::config() const { return postoffice_->config(); }
Role Node::role() const { return config().role; }
int Node::id() const { return postoffice_->id(); }
int Node::rank() const { return postoffice_->rank(); }
int Node::num_servers() const { return config().num_servers; }
int Node::num_workers() const { return config().num_workers; }
int Node::port() const { return postoffice_->port(); }
int Node::metrics_port() const { return postoffice_->metrics().port(); }
bool Node::SetMetric(const std::string& name, double value) {
  return postoffice_->metrics().SetGauge(name, value);
}
void Node::RecordCheckpoint(double seconds, uint64_t bytes) {
  postoffice_->metrics().CheckpointDone(seconds, bytes);
}
std::vector<int> Node::GetNodeIds(int group) const {
  return postoffice_->GetNodeIds(group);
}
std::string Node::DescribeNode(int id) const {
  return postoffice_->DescribeNode(id);
}
uint64_t Node::num_dropped_messages() const {
  return postoffice_->num_dropped();
}
uint64_t Node::num_resent_messages() const { return postoffice_->num_resent(); }
uint64_t Node::num_duplicate_messages() const {
  return postoffice_->num_duplicates();
}
uint64_t Node::num_test_drops() const { return postoffice_->num_test_drops(); }
uint64_t Node::num_fenced_messages() const { return postoffice_->num_fenced(); }
uint64_t Node::num_messages_sent() const { return postoffice_->num_sent(); }
uint64_t Node::num_messages_received() const {
  return postoffice_->num_received();
}
uint64_t Node::num_refused_connections() const {
  return postoffice_->num_refused();
}
uint64_t Node::num_shared_frames_sent() const {
  return postoffice_->van().num_shared_sent();
}
uint64_t Node::num_shared_frames_received() const {
  return postoffice_->van().num_shared_received();
}
Status Node::peer_failure() const { return postoffice_->peer_failure(); }
bool Node::rejoined() const { return postoffice_->rejoined(); }
void Node::SetPeerFailureHandler(std::function<void(const Status&)> handler) {
  postoffice_->SetPeerFailureHandler(
      [handler = std::move(handler)](int, const Status& why) {
        if (handler) handler(why);
      });
}
void Node::SetPeerFailureHandler(
    std::function<void(int id, const Status& why)> handler) {
  postoffice_->SetPeerFailureHandler(std::move(handler));
}
Postoffice* Node::postoffice() const { return postoffice_.get(); }

}  // namespace ps
