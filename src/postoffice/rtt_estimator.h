// RttEstimator: one peer's resend timeout, computed as TCP's (RFC 6298)
// from the round trips of acknowledged messages. Pure: no clock, no lock;
// the caller (Resender) owns one per peer under its own lock.
//
//   first sample R:  SRTT = R, RTTVAR = R / 2
//   later sample R:  RTTVAR = 3/4 RTTVAR + 1/4 |SRTT - R|,
//                    SRTT = 7/8 SRTT + 1/8 R
//   RTO = clamp(max(SRTT + 4 RTTVAR, 1.25 x recent max), floor, ceiling)
//         x backoff
//
// The recent max is the longest round trip sampled in this window of
// kWindowMs or the one before (a windowed maximum, as BBR keeps of the
// bandwidth). On a busy host round trips come in bursts (a receive thread
// that waits a scheduler slice or two before it acknowledges): SRTT +
// 4 RTTVAR forgets a burst within some ten samples, and the next would be
// resent spuriously, megabytes at a time.
//
// Before the first sample the RTO is the initial value (RFC 6298 2.1; here
// PS_RESEND_TIMEOUT_MS's default). A timeout doubles the backoff (5.5), up
// to the ceiling; a fresh sample resets it to 1 (5.7; the caller keeps
// samples unambiguous: Karn's rule, or an echo of which send was answered).
#ifndef PS_SRC_POSTOFFICE_RTT_ESTIMATOR_H_
#define PS_SRC_POSTOFFICE_RTT_ESTIMATOR_H_

#include <algorithm>
#include <cmath>

namespace ps {

class RttEstimator {
 public:
  // Times in milliseconds (fractions allowed); floor <= initial <= ceiling.
  RttEstimator(double initial_ms, double floor_ms, double ceiling_ms)
      : initial_ms_(initial_ms), floor_ms_(floor_ms), ceiling_ms_(ceiling_ms) {}

  static constexpr double kWindowMs = 5000;
  static constexpr double kMaxMargin = 1.25;

  // A round trip of rtt_ms, sampled at now_ms (any fixed origin).
  void OnSample(double rtt_ms, double now_ms = 0) {
    if (now_ms - window_start_ms_ >= kWindowMs) {
      previous_max_ms_ =
          now_ms - window_start_ms_ < 2 * kWindowMs ? window_max_ms_ : 0;
      window_max_ms_ = 0;
      window_start_ms_ = now_ms;
    }
    window_max_ms_ = std::max(window_max_ms_, rtt_ms);
    if (!sampled_) {
      srtt_ms_ = rtt_ms;
      rttvar_ms_ = rtt_ms / 2;
      sampled_ = true;
    } else {
      rttvar_ms_ = 0.75 * rttvar_ms_ + 0.25 * std::fabs(srtt_ms_ - rtt_ms);
      srtt_ms_ = 0.875 * srtt_ms_ + 0.125 * rtt_ms;
    }
    backoff_ = 1;
  }
  // A message to this peer went unacknowledged for an RTO.
  void OnTimeout() {
    if (rto_ms() < ceiling_ms_) backoff_ *= 2;
  }

  double rto_ms() const {
    const double recent =
        kMaxMargin * std::max(window_max_ms_, previous_max_ms_);
    double base = sampled_
                      ? std::clamp(std::max(srtt_ms_ + 4 * rttvar_ms_, recent),
                                   floor_ms_, ceiling_ms_)
                      : initial_ms_;
    return std::min(ceiling_ms_, base * backoff_);
  }
  bool sampled() const { return sampled_; }
  double srtt_ms() const { return srtt_ms_; }
  double rttvar_ms() const { return rttvar_ms_; }
  int backoff() const { return backoff_; }

 private:
  const double initial_ms_;
  const double floor_ms_;
  const double ceiling_ms_;
  bool sampled_ = false;
  double srtt_ms_ = 0;
  double rttvar_ms_ = 0;
  double window_start_ms_ = 0;
  double window_max_ms_ = 0;    // in the window that began then
  double previous_max_ms_ = 0;  // in the window before it
  int backoff_ = 1;
};

}  // namespace ps

#endif  // PS_SRC_POSTOFFICE_RTT_ESTIMATOR_H_
