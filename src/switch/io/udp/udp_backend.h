// The UDP socket backend: one socket and one thread per data thread, recvmmsg/sendmmsg bursts,
// UDP_SEGMENT (GSO) for the results a burst sends to each worker, UDP_GRO on receive.
#pragma once

#include <memory>
#include <string>

#include "switch/config.h"
#include "switch/engine/engine.h"
#include "switch/io/backend.h"

namespace gradswitch {

// Binds thread t's socket to control_host:data_port+t; nullptr with `error` set on failure.
std::unique_ptr<Backend> make_udp_backend(Engine& engine, const SwitchConfig& config, std::string* error);

}  // namespace gradswitch
