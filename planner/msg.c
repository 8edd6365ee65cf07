/* SPDX-License-Identifier: MIT */
/* msg.c: the planner's one formatter of error messages into a caller's buffer (msg.h).
 *
 * Used by the profile and plan readers (profile.c, plan.c), the timeline (timeline.c) and the
 * Chrome trace (trace_json.c); no state. */
#include "msg.h"

#include <stdarg.h>
#include <stdio.h>

void ooc_msg_say(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}
