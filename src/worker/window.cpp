// The slot pool (see window.h).
#include "worker/window.h"

namespace gradswitch::worker {

Window::Window(unsigned slots, uint32_t payload_bytes)
    : cap_((GS_HEADER_BYTES + payload_bytes + 63) & ~size_t{63}),
      mem_(cap_ * slots, 0),
      rounds_(slots),
      timers_(slots),
      next_version_(slots, 0) {}

void Window::seal(unsigned s, const gs_header& h, size_t payload_len) {
  SlotRound& r = rounds_[s];
  r.hdr = h;
  r.len = static_cast<uint32_t>(GS_HEADER_BYTES + payload_len);
  gs_header_encode(&r.hdr, buffer(s));
}

void Window::mark_retransmission(unsigned s) {
  SlotRound& r = rounds_[s];
  if (r.hdr.flags & GS_FLAG_RETX) return;
  r.hdr.flags |= GS_FLAG_RETX;
  gs_header_encode(&r.hdr, buffer(s));
}

}  // namespace gradswitch::worker
