// SimpleApp: ps-lite's request/response of an int head and a string body
// between any nodes of a job, the scheduler included. A request goes to
// one node id or to every node of a group id (kScheduler, kServerGroup,
// kWorkerGroup or a bit-or of them); the receiver's SimpleApp of the same
// app id answers it (by default with an empty body), and Wait(ts) returns
// once every receiver answered. As in ps-lite, the receiving app on a
// worker is the one of the same app id and the asker's customer id; on a
// server or the scheduler, the app's (SimpleApp(app_id) is customer
// app_id). An answer goes to the asking customer's app.
//
// Handles run on the node's receive thread, one message at a time per app;
// a request to this node itself runs its request handle on the calling
// thread. Handles must not Wait. Wait ends early, logging why, when a
// receiver is declared dead (the default node instead ends the process).
//
// Requests that reach an app before its request handle is set (ps-lite
// programs make the app and set the handle after ps::Start, when peers may
// have asked already) wait for it: they are handed to the new handle on
// the thread that sets it, or, when none is set within a second of the
// app's making, to the default handle on a thread of the app's own. A
// request for an app that is never made is refused after
// PS_CONNECT_TIMEOUT_MS, naming it; so are those waiting for an app
// destroyed before it took them.
//
// Thread-safety: Request/Response/Wait from any thread.
#ifndef PS_SIMPLE_APP_H_
#define PS_SIMPLE_APP_H_

#include <functional>
#include <memory>
#include <string>

#include "ps/base.h"
#include "ps/internal/utils.h"
#include "ps/node.h"

namespace ps {

// A received request or response.
struct SimpleData {
  int head = 0;
  std::string body;
  int sender = 0;       // node id
  int timestamp = 0;    // the requester's
  int customer_id = 0;  // the requester's app's customer id
};

class SimpleApp {
 public:
  using Handle = std::function<void(const SimpleData& recved, SimpleApp* app)>;

  // On DefaultNode() (made from the environment if need be; ps::Start may
  // come later).
  explicit SimpleApp(int app_id);
  // ps-lite's form: on customer_id's node (ps::Start; CustomerNode).
  SimpleApp(int app_id, int customer_id);
  // `node` must outlive this app.
  SimpleApp(Node* node, int app_id, int customer_id);
  virtual ~SimpleApp();
  SimpleApp(const SimpleApp&) = delete;
  SimpleApp& operator=(const SimpleApp&) = delete;

  // Sends (head, body) to `recv_id` (a node or a group); returns the
  // timestamp to Wait on.
  int Request(int req_head, const std::string& req_body, int recv_id);
  // Blocks until every receiver of request `timestamp` answered.
  void Wait(int timestamp);
  // Answers `recv_req` (same head) with `res_body`.
  void Response(const SimpleData& recv_req, const std::string& res_body = "");

  // Default request handle: answer with an empty body. Default response
  // handle: nothing.
  void set_request_handle(const Handle& request_handle);
  void set_response_handle(const Handle& response_handle);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ps

#endif  // PS_SIMPLE_APP_H_
