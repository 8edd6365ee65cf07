/* SPDX-License-Identifier: MIT */
/* msg.h: private to the planner: the one formatter of the messages that the readers, writers and
 * checkers leave in their caller's `err` buffer. */
#ifndef OOC_MSG_H
#define OOC_MSG_H

#include <stddef.h>

/* Formats the message into err (errlen bytes, always NUL-terminated, truncated when longer);
 * does nothing when err is NULL or errlen is 0, so callers pass theirs through unchecked. Never
 * allocates; thread-safe. */
void ooc_msg_say(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
