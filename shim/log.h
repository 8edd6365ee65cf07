/* SPDX-License-Identifier: MIT */
/* log.h: leveled logging that never allocates, one write(2) per line.
 *
 * A line reads `ooc[1234] W vmm.c:142: message` and is formatted into a stack buffer, so logging
 * is safe inside the allocator's own paths and tolerable in a signal handler. The macros test
 * the level (one relaxed atomic load) before they evaluate their arguments, so a disabled
 * OOC_LOG_D costs a load and a branch. Errors and warnings are capped per call site: after
 * OOC_LOG_CAP lines from one site, one "further ... suppressed" line and then silence. The
 * level and the file descriptor may be changed at any time from any thread. */
#ifndef OOC_LOG_H
#define OOC_LOG_H

#include <stdatomic.h>

#include "ooc.h"

typedef enum ooc_log_level {
    OOC_LOG_ERROR = 0,
    OOC_LOG_WARN = 1,
    OOC_LOG_INFO = 2,
    OOC_LOG_DEBUG = 3,
} ooc_log_level_t;

/* Lines an error or warning call site may print before it is silenced. */
#define OOC_LOG_CAP 10

/* Longest line, newline included; longer messages are cut and end in "...". */
#define OOC_LOG_LINE_MAX 1024

/* The current level; read by the macros. Use ooc_log_set_level to change it. */
extern OOC_INTERNAL _Atomic int ooc_log_threshold;

/* Sets the level (values outside error..debug are clamped) and returns the previous one. */
int ooc_log_set_level(int level);

/* The current level. */
int ooc_log_level(void);

/* Sends later lines to fd (stderr, 2, at start) and returns the previous fd. The caller keeps
 * ownership of both: the log never closes a descriptor. */
int ooc_log_set_fd(int fd);

/* The descriptor lines go to now (for the statistics table, which goes where the log goes). */
int ooc_log_fd(void);

/* Writes one banner line, "ooc[pid] ooc-shim: <message>", when warnings are on: the shim's own
 * announcements (start-up, profile recorded, plan in force), to the log's descriptor. One
 * write(2) from a stack buffer of OOC_LOG_BANNER_MAX bytes (longer messages are cut); no
 * allocation; preserves errno. */
#define OOC_LOG_BANNER_MAX 4608
void ooc_log_banner(const char *fmt, ...) OOC_PRINTF(1, 2);

/* The one-letter tag of a level ('E', 'W', 'I', 'D'); '?' for anything else. */
char ooc_log_letter(int level);

/* Formats and writes one line at `level` from file:line; `site` is the per-call-site counter
 * that caps repeated lines (NULL: never capped). Preserves errno. Thread-safe; no allocation.
 * Callers use the macros below, which check the level first. */
void ooc_log_write(int level, _Atomic unsigned *site, const char *file, int line, const char *fmt,
                   ...) OOC_PRINTF(5, 6);

#define OOC_LOG_ENABLED(lvl)                                                                       \
    (atomic_load_explicit(&ooc_log_threshold, memory_order_relaxed) >= (lvl))

#define OOC_LOG_CAPPED_(lvl, ...)                                                                  \
    do {                                                                                           \
        if (OOC_UNLIKELY(OOC_LOG_ENABLED(lvl))) {                                                  \
            static _Atomic unsigned ooc_log_site_;                                                 \
            ooc_log_write((lvl), &ooc_log_site_, __FILE__, __LINE__, __VA_ARGS__);                 \
        }                                                                                          \
    } while (0)

#define OOC_LOG_PLAIN_(lvl, ...)                                                                   \
    do {                                                                                           \
        if (OOC_UNLIKELY(OOC_LOG_ENABLED(lvl)))                                                    \
            ooc_log_write((lvl), NULL, __FILE__, __LINE__, __VA_ARGS__);                           \
    } while (0)

/* Errors and warnings are capped per call site; info and debug lines are not (they are off by
 * default, and whoever turns them on wants every line). */
#define OOC_LOG_E(...) OOC_LOG_CAPPED_(OOC_LOG_ERROR, __VA_ARGS__)
#define OOC_LOG_W(...) OOC_LOG_CAPPED_(OOC_LOG_WARN, __VA_ARGS__)
#define OOC_LOG_I(...) OOC_LOG_PLAIN_(OOC_LOG_INFO, __VA_ARGS__)
#define OOC_LOG_D(...) OOC_LOG_PLAIN_(OOC_LOG_DEBUG, __VA_ARGS__)

#endif
