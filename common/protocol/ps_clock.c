#include "ps_clock.h"

#include <time.h>

int64_t ps_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t ps_mono_ms(void)
{
    return ps_mono_ns() / 1000000;
}

double ps_mono_s(void)
{
    return (double)ps_mono_ns() * 1e-9;
}
