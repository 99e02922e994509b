/* systemd service notifications (sd_notify from libsystemd): READY=1 once
 * a process can do its job, WATCHDOG=1 from its loop when the unit has
 * WatchdogSec=, STOPPING=1 on the way out, and a STATUS= line. Outside
 * systemd (no $NOTIFY_SOCKET) every call is a cheap no-op. */
#ifndef PS_NOTIFY_H
#define PS_NOTIFY_H

void ps_notify_ready(const char *status);
/* Pets the watchdog; rate-limited to a quarter of WatchdogSec, so it may be
 * called every loop turn. */
void ps_notify_watchdog(void);
void ps_notify_status(const char *status);
void ps_notify_stopping(void);

#endif
