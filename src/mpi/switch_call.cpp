// The switch part of an Op (see switch_call.h).
#include "mpi/switch_call.h"

#include "gradswitch/wire.h"

namespace gradswitch::mpi {

std::string join_wire(FloatWire wire) {
  switch (wire) {
    case FloatWire::kFixed32:
      return "fixed32";
    case FloatWire::kFloat64:
      return "float64";
    case FloatWire::kNative:
    case FloatWire::kFloat32:
      return "float32";
  }
  return "float32";
}

worker::Handle start_switch(worker::Group& group, Op& op, FloatWire wire) {
  const worker::DType dtype = op.elem == Elem::kInt32     ? worker::DType::kInt32
                              : op.elem == Elem::kFloat64 ? worker::DType::kFloat64
                                                          : worker::DType::kFloat32;
  // Out of place: the contribution stays intact for a fallback; a non-root of MPI_Reduce keeps no sum.
  return group.allreduce_async(op.input, op.output, static_cast<size_t>(op.count), dtype,
                               wire_elem(op.elem, wire));
}

}  // namespace gradswitch::mpi
