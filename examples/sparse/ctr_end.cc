// Worker 0's word that the job is over (ctr_end.h).
#include "ctr_end.h"

#include <chrono>

#include "ctr_job.h"

namespace ctr {

EndWord::EndWord() : app_(kEndApp, 0) {
  app_.set_request_handle(
      [this](const ps::SimpleData& req, ps::SimpleApp* app) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          said_ = true;
        }
        cv_.notify_all();
        app->Response(req);
      });
}

void EndWord::Announce() {
  app_.Wait(app_.Request(0, "",
                         ps::kScheduler | ps::kServerGroup | ps::kWorkerGroup));
}

bool EndWord::Wait(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                      [this] { return said_; });
}

}  // namespace ctr
