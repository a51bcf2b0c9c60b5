// What Config reads from the system: the process environment
// (Config::ProcessVariables) and a network interface's address
// (InterfaceAddress, for DMLC_INTERFACE).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <map>
#include <string>

#include "ps/config.h"

extern char** environ;

namespace ps {

std::map<std::string, std::string> Config::ProcessVariables() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string name = kv.substr(0, eq);
    if (name.rfind("DMLC_", 0) == 0 || name.rfind("PS_", 0) == 0) {
      env[name] = kv.substr(eq + 1);
    }
  }
  return env;
}

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
