/* SPDX-License-Identifier: MIT */
/* log.h - one logging macro that checks the level before evaluating its
 * arguments (redis serverLog); lines go to stderr, one per event, in a form
 * journald keeps ("<N>" priority prefix when stderr is the journal stream
 * that JOURNAL_STREAM names, or when WEX_LOG_JOURNAL=1). */
#ifndef WEX_LOG_H
#define WEX_LOG_H

#include <errno.h>

enum wex_log_level { WEX_LOG_ERROR = 0, WEX_LOG_WARN, WEX_LOG_INFO, WEX_LOG_DEBUG, WEX_LOG_TRACE };

extern int wex__log_level;
void wex__log_init(void); /* reads WEX_LOG_LEVEL, WEX_LOG_JOURNAL, JOURNAL_STREAM */
int wex__log_level_from_name(const char *s);
const char *wex__log_level_name(int level);
void wex__log(int level, const char *subsys, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#define wex_log(level, subsys, ...)                                                  \
	do {                                                                         \
		if ((level) <= wex__log_level) {                                     \
			int wex__saved_errno = errno;                                \
			wex__log((level), (subsys), __VA_ARGS__);                   \
			errno = wex__saved_errno;                                    \
		}                                                                    \
	} while (0)
#define wex_error(ss, ...) wex_log(WEX_LOG_ERROR, ss, __VA_ARGS__)
#define wex_warn(ss, ...) wex_log(WEX_LOG_WARN, ss, __VA_ARGS__)
#define wex_info(ss, ...) wex_log(WEX_LOG_INFO, ss, __VA_ARGS__)
#define wex_debug(ss, ...) wex_log(WEX_LOG_DEBUG, ss, __VA_ARGS__)

/* NCCLCHECK-style propagation: evaluate, and jump to `label` with `ret` set
 * on a negative result. */
#define WEX_CHECK_GOTO(expr, ret, label)                                             \
	do {                                                                         \
		(ret) = (expr);                                                      \
		if ((ret) < 0)                                                       \
			goto label;                                                  \
	} while (0)

/* Formats a message into err (if err and errlen are non-zero). */
#include <stddef.h>
void wex__seterr(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#define WEX_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#endif
