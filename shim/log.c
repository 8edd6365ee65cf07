/* SPDX-License-Identifier: MIT */
/* log.c: formats a log line into a stack buffer and writes it with one write(2).
 *
 * No allocation, no lock: the level and the descriptor are atomics, each call site's cap
 * counter is an atomic the macro declares. vsnprintf is not on POSIX's async-signal-safe list,
 * but glibc's does not allocate for the integer and string conversions we use, which is the
 * "tolerable in a signal handler" this module promises. Callers: every module of the shim. */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

_Atomic int ooc_log_threshold = OOC_LOG_WARN;
static _Atomic int log_fd = STDERR_FILENO;

int ooc_log_set_level(int level) {
    if (level < OOC_LOG_ERROR)
        level = OOC_LOG_ERROR;
    if (level > OOC_LOG_DEBUG)
        level = OOC_LOG_DEBUG;
    return atomic_exchange_explicit(&ooc_log_threshold, level, memory_order_relaxed);
}

int ooc_log_level(void) {
    return atomic_load_explicit(&ooc_log_threshold, memory_order_relaxed);
}

int ooc_log_set_fd(int fd) {
    return atomic_exchange_explicit(&log_fd, fd, memory_order_relaxed);
}

int ooc_log_fd(void) {
    return atomic_load_explicit(&log_fd, memory_order_relaxed);
}

char ooc_log_letter(int level) {
    static const char letters[] = "EWID";
    return level >= OOC_LOG_ERROR && level <= OOC_LOG_DEBUG ? letters[level] : '?';
}

/* Writes all of buf (a short write to a pipe or a signal can cut it), retrying on EINTR. */
static void write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        buf += n;
        len -= (size_t)n;
    }
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* Appends "ooc[pid] L file:line: " to buf and returns its length (never more than cap - 1). */
static size_t prefix(char *buf, size_t cap, int level, const char *file, int line) {
    int n = snprintf(buf, cap, "ooc[%ld] %c %s:%d: ", (long)getpid(), ooc_log_letter(level),
                     base_name(file), line);
    if (n < 0)
        return 0;
    return (size_t)n < cap ? (size_t)n : cap - 1;
}

void ooc_log_write(int level, _Atomic unsigned *site, const char *file, int line, const char *fmt,
                   ...) {
    int saved_errno = errno;
    char buf[OOC_LOG_LINE_MAX];
    size_t len;

    if (site) {
        /* Stop counting once past the cap so that the counter never wraps back to zero. */
        if (atomic_load_explicit(site, memory_order_relaxed) > OOC_LOG_CAP)
            goto out;
        unsigned n = atomic_fetch_add_explicit(site, 1, memory_order_relaxed) + 1;
        if (n > OOC_LOG_CAP + 1)
            goto out;
        if (n == OOC_LOG_CAP + 1) {
            len = prefix(buf, sizeof buf, level, file, line);
            int m = snprintf(buf + len, sizeof buf - len, "further %s from here suppressed\n",
                             level == OOC_LOG_ERROR ? "errors" : "warnings");
            if (m > 0)
                len += (size_t)m < sizeof buf - len ? (size_t)m : sizeof buf - len - 1;
            write_all(atomic_load_explicit(&log_fd, memory_order_relaxed), buf, len);
            goto out;
        }
    }

    len = prefix(buf, sizeof buf, level, file, line);
    /* Leave room for the newline that ends every line. */
    size_t room = sizeof buf - 1 - len;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + len, room + 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    if ((size_t)m > room) {
        len += room;
        memcpy(buf + len - 3, "...", 3);
    } else {
        len += (size_t)m;
    }
    /* A message that ends in its own newline does not get a second one. */
    if (len == 0 || buf[len - 1] != '\n')
        buf[len++] = '\n';
    write_all(atomic_load_explicit(&log_fd, memory_order_relaxed), buf, len);
out:
    errno = saved_errno;
}

void ooc_log_banner(const char *fmt, ...) {
    if (!OOC_LOG_ENABLED(OOC_LOG_WARN))
        return;
    int saved_errno = errno;
    char buf[OOC_LOG_BANNER_MAX];
    int n = snprintf(buf, sizeof buf, "ooc[%ld] ooc-shim: ", (long)getpid());
    size_t len = n > 0 ? (size_t)n : 0;
    size_t room = sizeof buf - 1 - len; /* the newline's */
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + len, room + 1, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    len += (size_t)m > room ? room : (size_t)m;
    if (len == 0 || buf[len - 1] != '\n')
        buf[len++] = '\n';
    write_all(atomic_load_explicit(&log_fd, memory_order_relaxed), buf, len);
    errno = saved_errno;
}
