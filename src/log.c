/* SPDX-License-Identifier: MIT */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "proto.h" /* wex__utf8_scrub */

int wex__log_level = WEX_LOG_INFO;
static int log_journal;

static const char *level_names[] = { "error", "warn", "info", "debug", "trace" };
/* syslog priorities journald reads from a "<N>" prefix */
static const int level_prio[] = { 3, 4, 6, 7, 7 };

int wex__log_level_from_name(const char *s)
{
	for (size_t i = 0; i < WEX_ARRAY_SIZE(level_names); i++)
		if (!strcasecmp(s, level_names[i]))
			return (int)i;
	return -1;
}

const char *wex__log_level_name(int level)
{
	if (level < 0 || level >= (int)WEX_ARRAY_SIZE(level_names))
		return "?";
	return level_names[level];
}

/* Under systemd, JOURNAL_STREAM names the journal stream's device and
 * inode.  Children inherit the variable even where their stderr goes
 * elsewhere (wexd run by hand from a shell that a service started, a test
 * runner), so it counts only when stderr is that stream (systemd.exec(5)). */
static int stderr_is_journal(void)
{
	const char *s = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!s || sscanf(s, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
		return 0;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void wex__log_init(void)
{
	const char *s = getenv("WEX_LOG_LEVEL");
	int l;

	if (s && (l = wex__log_level_from_name(s)) >= 0)
		wex__log_level = l;
	s = getenv("WEX_LOG_JOURNAL");
	log_journal = (s && *s == '1') || stderr_is_journal();
}

void wex__log(int level, const char *subsys, const char *fmt, ...)
{
	char buf[1024];
	int off = 0;
	va_list ap;

	if (level < 0)
		level = 0;
	if (level > WEX_LOG_TRACE)
		level = WEX_LOG_TRACE;
	if (log_journal) {
		off = snprintf(buf, sizeof(buf), "<%d>%s %s: ", level_prio[level], subsys,
			       level_names[level]);
	} else {
		struct timespec ts;
		struct tm tm;

		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		off = snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ [%d] %s %s: ",
			       tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
			       tm.tm_sec, ts.tv_nsec / 1000000, (int)getpid(), subsys,
			       level_names[level]);
	}
	va_start(ap, fmt);
	if (off < (int)sizeof(buf))
		off += vsnprintf(buf + off, sizeof(buf) - (size_t)off, fmt, ap);
	va_end(ap);
	if (off >= (int)sizeof(buf) - 1)
		off = (int)sizeof(buf) - 2;
	/* A line cut at the limit may end inside a UTF-8 character (a
	 * model's name, a value quoted from the file): journald keeps a line
	 * that is not UTF-8 as binary, and journalctl shows "[blob data]"
	 * instead of it. */
	buf[off] = '\0';
	wex__utf8_scrub(buf);
	/* One event, one line: fold embedded newlines; and no other control
	 * character (a client's names may carry terminal escapes) reaches
	 * the log. */
	for (int i = 0; i < off; i++)
		if (buf[i] == '\n' || buf[i] == '\t')
			buf[i] = ' ';
		else if ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f)
			buf[i] = '?';
	buf[off++] = '\n';
	(void)!write(STDERR_FILENO, buf, (size_t)off);
}

void wex__seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}
