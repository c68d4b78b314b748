// Classification of MPI datatypes for the switch (see datatypes.h).
#include "mpi/datatypes.h"

#include "gradswitch/wire.h"

namespace gradswitch::mpi {

namespace {

// Fortran types exist in C as handles, but their sizes depend on the Fortran compiler.
bool has_size(MPI_Datatype type, int bytes) {
  int size = 0;
  return PMPI_Type_size(type, &size) == MPI_SUCCESS && size == bytes;
}

}  // namespace

Elem classify(MPI_Datatype type) {
  if (type == MPI_DATATYPE_NULL) return Elem::kNone;
  if (type == MPI_INT || type == MPI_INT32_T || type == MPI_UNSIGNED || type == MPI_UINT32_T)
    return Elem::kInt32;
  if (sizeof(long) == 4 && (type == MPI_LONG || type == MPI_UNSIGNED_LONG)) return Elem::kInt32;
  if (type == MPI_FLOAT) return Elem::kFloat32;
  if (type == MPI_DOUBLE) return Elem::kFloat64;
  if (type == MPI_INTEGER && has_size(type, 4)) return Elem::kInt32;
  if (type == MPI_REAL && has_size(type, 4)) return Elem::kFloat32;
  if (type == MPI_DOUBLE_PRECISION && has_size(type, 8)) return Elem::kFloat64;
  return Elem::kNone;
}

size_t elem_bytes(Elem e) {
  switch (e) {
    case Elem::kInt32:
    case Elem::kFloat32:
      return 4;
    case Elem::kFloat64:
      return 8;
    case Elem::kNone:
      return 0;
  }
  return 0;
}

const char* elem_name(Elem e) {
  switch (e) {
    case Elem::kInt32:
      return "int32";
    case Elem::kFloat32:
      return "float32";
    case Elem::kFloat64:
      return "float64";
    case Elem::kNone:
      return "none";
  }
  return "?";
}

uint8_t wire_elem(Elem e, FloatWire wire) {
  if (e == Elem::kInt32) return GS_ELEM_INT32;
  switch (wire) {
    case FloatWire::kFloat32:
      return GS_ELEM_FLOAT32;
    case FloatWire::kFixed32:
      return GS_ELEM_FIXED32;
    case FloatWire::kFloat64:
      return GS_ELEM_FLOAT64;
    case FloatWire::kNative:
      return e == Elem::kFloat64 ? GS_ELEM_FLOAT64 : GS_ELEM_FLOAT32;
  }
  return 0;
}

}  // namespace gradswitch::mpi
