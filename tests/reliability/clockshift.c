/* LD_PRELOAD shim: CLOCK_REALTIME (time.time(), datetime.now()) runs ahead or behind by the number of seconds
 * written in the file named by $CLOCKSHIFT_FILE, re-read on every call, so a test can step the wall clock of a
 * running process as an NTP step or an operator's `date -s` would. CLOCK_MONOTONIC is left alone, as a real
 * step leaves it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static int (*real_clock_gettime)(clockid_t, struct timespec *);

static double offset(void) {
    const char *path = getenv("CLOCKSHIFT_FILE");
    double off = 0;
    FILE *f = path ? fopen(path, "r") : NULL;
    if (f) {
        if (fscanf(f, "%lf", &off) != 1) off = 0;
        fclose(f);
    }
    return off;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    if (!real_clock_gettime) real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real_clock_gettime(clk, ts);
    if (rc == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) {
        double off = offset();
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + (long long)(off * 1e9);
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0 && tv) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
    (void)tz;
    return rc;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
