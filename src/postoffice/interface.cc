// InterfaceAddress (ps/config.h): DMLC_INTERFACE's lookup.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <string>

#include "ps/config.h"

namespace ps {

StatusOr<std::string> InterfaceAddress(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return Status::Unavailable("getifaddrs failed looking for interface '" +
                               name + "'");
  }
  std::string found;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (name != a->ifa_name) continue;
    char buf[INET_ADDRSTRLEN];
    auto* sin = reinterpret_cast<sockaddr_in*>(a->ifa_addr);
    inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf));
    found = buf;
    break;
  }
  freeifaddrs(list);
  if (found.empty()) {
    return Status::InvalidArgument("interface '" + name +
                                   "' has no IPv4 address");
  }
  return found;
}

}  // namespace ps
