/* 16-bit floats on the wire: IEEE half (f16) and bfloat16 (bf16).
 *
 * Conversions round to nearest, ties to even; NaN stays NaN (quiet),
 * infinities and signed zeros are kept, f16 subnormals are produced and
 * read exactly, values past f16's range become infinity. Portable C on the
 * bit patterns; no CPU feature is assumed. Servers keep f32: these are
 * only for the bytes between processes. */
#ifndef PS_HALF_H
#define PS_HALF_H

#include <stddef.h>
#include <stdint.h>

uint16_t ps_f32_to_f16(float f);
float ps_f16_to_f32(uint16_t h);
uint16_t ps_f32_to_bf16(float f);
float ps_bf16_to_f32(uint16_t h);

/* Bulk conversions; src and dst may be unaligned (copied bytewise). */
void ps_f32_to_half_n(int dtype, const float *src, void *dst, size_t n);
void ps_half_to_f32_n(int dtype, const void *src, float *dst, size_t n);

#endif
