// ps::Environment (ps/internal/env.h): one table per process, defined here
// so that the library and the program share it; ps::Start reads it
// (default_node.cc), so it belongs to the postoffice, not to ps-lite's layer.
#include "ps/internal/env.h"

namespace ps {

std::shared_ptr<Environment> Environment::_GetSharedRef() {
  // Built through `new`: the constructor is private.
  static std::shared_ptr<Environment> env(new Environment);
  return env;
}

Environment* Environment::Init(const Vars& envs) {
  Environment* env = Get();
  env->kvs_ = envs;
  return env;
}

}  // namespace ps
