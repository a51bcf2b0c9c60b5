// ps::Environment: ps-lite's process-wide table of environment values set
// from code. Values given to Init take precedence over the process
// environment, in find and (for DMLC_* and PS_* names) in the default
// node's configuration, which is read once, when ps::Start or any ps.h
// accessor first needs the node: call Init before that.
//
// Thread-safety: Init before other threads use the table; find and vars
// from any thread after that.
#ifndef PS_INTERNAL_ENV_H_
#define PS_INTERNAL_ENV_H_

#include <cstdlib>
#include <memory>
#include <string>
#include <unordered_map>

namespace ps {

class Environment {
 public:
  using Vars = std::unordered_map<std::string, std::string>;

  static Environment* Get() { return _GetSharedRef().get(); }
  // Shares the table's ownership (ps-lite: lets an application keep it
  // alive through static destruction).
  static std::shared_ptr<Environment> _GetSharedRef();
  // Replaces the values set from code with `envs`.
  static Environment* Init(const Vars& envs);

  // The value set from code, else the process environment's; nullptr if
  // neither has `k`. The pointer stays valid until the next Init.
  const char* find(const char* k) const {
    auto it = kvs_.find(k);
    return it == kvs_.end() ? std::getenv(k) : it->second.c_str();
  }
  // The values set from code.
  const Vars& vars() const { return kvs_; }

 private:
  Environment() = default;

  Vars kvs_;
};

}  // namespace ps

#endif  // PS_INTERNAL_ENV_H_
