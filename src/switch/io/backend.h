// The interface between the daemon and an I/O backend (one folder per backend under io/).
#pragma once

#include <atomic>
#include <string>

namespace gradswitch {

class Engine;

class Backend {
 public:
  virtual ~Backend() = default;
  // One line for the startup log: ports, threads, variant.
  virtual std::string describe() const = 0;
  // Runs the data path on the backend's own threads until `stop` becomes true; returns 0 on a
  // clean stop. Errors that prevent starting are reported by the factory, not here.
  virtual int run(const std::atomic<bool>& stop) = 0;
};

}  // namespace gradswitch
