// Which MPI datatypes the switch reduces, and how they travel.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>

#include "mpi/config.h"

namespace gradswitch::mpi {

// The element classes the library takes over; everything else goes to MPI unchanged.
enum class Elem : uint8_t { kNone, kInt32, kFloat32, kFloat64 };

// MPI_INT, MPI_INT32_T, MPI_UNSIGNED, MPI_UINT32_T (and MPI_LONG / MPI_UNSIGNED_LONG where long
// is 32-bit): 32-bit two's complement sums wrap the same way signed or not. MPI_FLOAT, MPI_DOUBLE
// (and MPI_REAL / MPI_DOUBLE_PRECISION when they have those sizes). Derived types: kNone.
Elem classify(MPI_Datatype type);
size_t elem_bytes(Elem e);
const char* elem_name(Elem e);

// The wire element type (gs_elem_type) `e` travels as with the configured float wire.
uint8_t wire_elem(Elem e, FloatWire wire);

}  // namespace gradswitch::mpi
