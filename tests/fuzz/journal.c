/* SPDX-License-Identifier: MIT */
/*
 * journal.c - fuzzes what a starting wexd reads back from its lease
 * journal (journal.h): the input is the file of one record, which
 * wex__journal_scan reads from `<socket>.leases` in a directory of its own.
 *
 * A record it calls back with must hold values in their ranges (names
 * NUL-terminated, 1 to WEX_NAME_MAX - 1 bytes; rank < world <=
 * WEX_WORLD_MAX; version, pid >= 1; a known mode; a boot id that fits)
 * and stays in place; anything else (a stray, an ended lease) is removed,
 * but for a newer wexd's record (wex_lease > 1) that this one cannot read,
 * left for that wexd.
 * Writing an accepted record again with wex__journal_put and scanning
 * gives it back the same (but for the boot id, which is this boot's).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "fuzz.h"
#include "journal.h"
#include "log.h"
#include "proto.h"

struct seen {
	int n;
	char name[WEX_JOURNAL_NAME_MAX];
	struct wex_journal_rec r;
};

static void on_rec(void *arg, const char *name, const struct wex_journal_rec *r)
{
	struct seen *s = arg;

	s->n++;
	snprintf(s->name, sizeof(s->name), "%s", name);
	s->r = *r;
}

static struct wex_journal j;
static char dir[] = "/tmp/wex-fuzz-journal-XXXXXX";

/* Leaves no directory behind. */
static void cleanup(void)
{
	unlinkat(j.dirfd, "r", 0);
	unlinkat(j.dirfd, "w", 0);
	wex__journal_close(&j);
	rmdir(j.path);
	rmdir(dir);
}

static void check_rec(const struct wex_journal_rec *r)
{
	size_t ml = strnlen(r->model, sizeof(r->model)), gl = strnlen(r->group, sizeof(r->group));

	FZ_ASSERT(ml > 0 && ml < sizeof(r->model), "model of %zu bytes", ml);
	FZ_ASSERT(gl > 0 && gl < sizeof(r->group), "group of %zu bytes", gl);
	FZ_ASSERT(strnlen(r->boot, sizeof(r->boot)) < sizeof(r->boot), "boot not terminated");
	FZ_ASSERT(r->world >= 1 && r->world <= WEX_WORLD_MAX && r->rank < r->world,
		  "rank %u of %u", r->rank, r->world);
	FZ_ASSERT(r->version >= 1, "version 0");
	FZ_ASSERT(r->pid >= 1, "pid %d", (int)r->pid);
	FZ_ASSERT(r->mode == WEX_SYNC_REMAP_VIEW || r->mode == WEX_SYNC_REMAP_FIXED ||
			  r->mode == WEX_JOURNAL_ROUND || r->mode == WEX_JOURNAL_LOST ||
			  r->mode == (WEX_JOURNAL_LOST | WEX_SYNC_REMAP_VIEW) ||
			  r->mode == (WEX_JOURNAL_LOST | WEX_SYNC_REMAP_FIXED),
		  "mode %d", r->mode);
}

static int same_rec(const struct wex_journal_rec *a, const struct wex_journal_rec *b)
{
	return !strcmp(a->model, b->model) && !strcmp(a->group, b->group) && a->rank == b->rank &&
	       a->world == b->world && a->version == b->version && a->mode == b->mode &&
	       a->pid == b->pid && a->uid == b->uid && a->start == b->start;
}

/* A record of a newer wexd's format (wex_lease > 1), as the scan reads
 * the first page. */
static int newer(const uint8_t *data, size_t size)
{
	json_t *o = json_loadb((const char *)data, size > 4096 ? 4096 : size,
			       JSON_REJECT_DUPLICATES, NULL);
	int ret = o && json_integer_value(json_object_get(o, "wex_lease")) > 1;

	json_decref(o);
	return ret;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int init;
	char wname[WEX_JOURNAL_NAME_MAX] = "w";
	struct seen s = { 0 }, s2 = { 0 };
	int fd, wfd = -1, ret;

	if (!init) {
		char sock[64];

		FZ_ASSERT(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
		snprintf(sock, sizeof(sock), "%s/s", dir);
		FZ_ASSERT(wex__journal_open(&j, sock) == 0, "journal: %s", j.why);
		atexit(cleanup);
		wex__log_level = WEX_LOG_ERROR;
		init = 1;
	}
	fd = openat(j.dirfd, "r", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	FZ_ASSERT(fd >= 0, "creating the record: %s", strerror(errno));
	FZ_ASSERT(write(fd, data, size) == (ssize_t)size, "writing the record");
	close(fd);
	wex__journal_scan(&j, on_rec, &s);
	FZ_ASSERT(s.n <= 1, "%d records from one file", s.n);
	ret = faccessat(j.dirfd, "r", F_OK, 0);
	if (!s.n) {
		FZ_ASSERT((ret < 0 && errno == ENOENT) || (ret == 0 && newer(data, size)),
			  "a record refused is left in place");
		unlinkat(j.dirfd, "r", 0);
		return 0;
	}
	FZ_ASSERT(ret == 0, "a record accepted is removed");
	FZ_ASSERT(!strcmp(s.name, "r"), "called back for %s", s.name);
	check_rec(&s.r);
	unlinkat(j.dirfd, "r", 0);
	/* Written again as wexd writes it, it reads back the same. */
	ret = wex__journal_put(&j, &wfd, wname, &s.r);
	FZ_ASSERT(ret == 0, "writing an accepted record: %s", strerror(-ret));
	wex__journal_scan(&j, on_rec, &s2);
	FZ_ASSERT(s2.n == 1, "a record written reads back as %d", s2.n);
	FZ_ASSERT(same_rec(&s.r, &s2.r), "a record written reads back changed");
	wex__journal_del(&j, &wfd, wname);
	return 0;
}
