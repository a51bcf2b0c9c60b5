// Metrics that count nothing, the refusal reasons, and the factory that the
// Prometheus exporter registers.
#include "metrics/metrics.h"

#include <atomic>

namespace ps {

namespace {

// Constant-initialized, so a factory registered while another translation
// unit's statics are initialized is never overwritten by this one's.
std::atomic<MetricsFactory> metrics_factory{nullptr};

bool Contains(const std::string& text, const char* word) {
  return text.find(word) != std::string::npos;
}

}  // namespace

const char* RefusalReasonName(RefusalReason reason) {
  switch (reason) {
    case RefusalReason::kAuthentication:
      return "authentication";
    case RefusalReason::kSize:
      return "size";
    case RefusalReason::kMalformed:
      return "malformed";
    case RefusalReason::kNotAMember:
      return "not_a_member";
    case RefusalReason::kOther:
      break;
  }
  return "other";
}

RefusalReason ClassifyRefusal(const std::string& why) {
  // The words of the reasons the van and the postoffice give (grep
  // CountDropped); the first that fits wins.
  if (Contains(why, "claims to be") || Contains(why, "unknown sender") ||
      Contains(why, "not a member") || Contains(why, "no worker of ours") ||
      Contains(why, "registration refused")) {
    return RefusalReason::kNotAMember;
  }
  if (Contains(why, "seal") || Contains(why, "open") ||
      Contains(why, "token") || Contains(why, "key") ||
      Contains(why, "authenticat")) {
    return RefusalReason::kAuthentication;
  }
  if (Contains(why, "bytes") || Contains(why, "too large") ||
      Contains(why, "too many") || Contains(why, "over ") ||
      Contains(why, "budget")) {
    return RefusalReason::kSize;
  }
  if (Contains(why, "malformed") || Contains(why, "unexpected") ||
      Contains(why, "decode") || Contains(why, "without exactly") ||
      Contains(why, "header") || Contains(why, "frame") ||
      Contains(why, "does not take")) {
    return RefusalReason::kMalformed;
  }
  return RefusalReason::kOther;
}

Status Metrics::Serve(const std::string& /*host*/, int port,
                      const std::string& /*token*/) {
  return Status::InvalidArgument(
      "PS_METRICS_PORT=" + std::to_string(port) +
      ": this program is linked without the Prometheus exporter "
      "(ps::exporter); link ps::ps, or ps::exporter beside ps::kv");
}

void RegisterMetricsFactory(MetricsFactory factory) {
  metrics_factory.store(factory);
}

std::unique_ptr<Metrics> MakeMetrics(Role role) {
  const MetricsFactory factory = metrics_factory.load();
  if (factory != nullptr) return factory(role);
  return std::make_unique<Metrics>();
}

}  // namespace ps
