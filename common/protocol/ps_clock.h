/* The monotonic clock every deadline, rate and benchmark reads. */
#ifndef PS_CLOCK_H
#define PS_CLOCK_H

#include <stdint.h>

/* Nanoseconds on CLOCK_MONOTONIC: comparable only within one boot. */
int64_t ps_mono_ns(void);

/* The same clock in whole milliseconds, for deadlines. */
int64_t ps_mono_ms(void);

/* The same clock in seconds, for rates and durations printed. */
double ps_mono_s(void);

#endif
