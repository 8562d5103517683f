/* kernels/convert.h: rows of any tensor type (kernels/types.h) to f32 and back, by the CPU
 * backend's scalar references, which define every type's values: what tools use to convert
 * models and make weights, and loaders to widen small vectors (norms, biases). */
#ifndef LLMGW_KERNELS_CONVERT_H
#define LLMGW_KERNELS_CONVERT_H

#include <stdint.h>

/* A row of n elements of type id to f32, and f32 to the type. 0, or -1 for an unknown type, a
 * type with no conversion that way, or an n that is not a whole number of blocks. */
int kern_type_to_f32(uint32_t id, const void *row, float *out, int64_t n);
int kern_type_from_f32(uint32_t id, const float *x, void *row, int64_t n);

#endif
