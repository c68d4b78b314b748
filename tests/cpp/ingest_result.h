// What the engine tests read back from an IngestResult: its datagram's header, decoded.
#pragma once

#include "common/header.h"
#include "switch/engine/engine.h"

namespace gradswitch {

inline gs_header header_of(const IngestResult& r) {
  gs_header h;
  gs_header_decode(r.data, &h);
  return h;
}

}  // namespace gradswitch
