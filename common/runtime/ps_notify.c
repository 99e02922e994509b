/* sd_notify wrappers (see ps_notify.h). */
#include "ps_notify.h"
#include "ps_clock.h"

#include <stdint.h>
#include <stdio.h>
#include <systemd/sd-daemon.h>
#include <uv.h>

static uint64_t now_us(void)
{
    return (uint64_t)ps_mono_ns() / 1000u;
}

void ps_notify_ready(const char *status)
{
    char msg[512];
    snprintf(msg, sizeof msg, "READY=1\nSTATUS=%s", status);
    sd_notify(0, msg);
}

void ps_notify_watchdog(void)
{
    static int checked;
    static uint64_t every_us, last_us;
    if (!checked) {
        uint64_t usec = 0;
        checked = 1;
        every_us = sd_watchdog_enabled(0, &usec) > 0 ? usec / 4 : 0;
    }
    if (every_us == 0)
        return;
    uint64_t now = now_us();
    if (now - last_us >= every_us) {
        last_us = now;
        sd_notify(0, "WATCHDOG=1");
    }
}

void ps_notify_status(const char *status)
{
    char msg[512];
    snprintf(msg, sizeof msg, "STATUS=%s", status);
    sd_notify(0, msg);
}

void ps_notify_stopping(void)
{
    sd_notify(0, "STOPPING=1");
}
