/* kernels/convert.c: row conversions through the CPU references (kernels/cpu/quant.h). */
#include "kernels/convert.h"

#include "kernels/cpu/quant.h"
#include "kernels/types.h"

int kern_type_to_f32(uint32_t id, const void *row, float *out, int64_t n)
{
    const kern_wtype *w = kern_wtype_get_ref(id);
    if (w == NULL || n < 0 || (uint64_t)n % kern_type_get(id)->block_elems != 0)
        return -1;
    w->to_f32(row, out, n);
    return 0;
}

int kern_type_from_f32(uint32_t id, const float *x, void *row, int64_t n)
{
    const kern_wtype *w = kern_wtype_get_ref(id);
    if (w == NULL || w->from_f32 == NULL || n < 0 ||
        (uint64_t)n % kern_type_get(id)->block_elems != 0)
        return -1;
    w->from_f32(x, row, n);
    return 0;
}
