/* SPDX-License-Identifier: MIT */
/*
 * journal.c - remap leases written down so that they outlive wexd (see
 * journal.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "journal.h"
#include "log.h"
#include "proto.h"

#define REC_MAX 4096

static uint64_t instance; /* this wexd's start, realtime ns: unique names */

/* Opens (creating it) the directory j->path, refusing one that is not
 * ours; 0 or -errno with j->why. */
static int dir_open(struct wex_journal *j)
{
	struct stat st;
	int fd, ret;

	if (mkdir(j->path, 0700) < 0 && errno != EEXIST) {
		ret = -errno;
		snprintf(j->why, sizeof(j->why), "mkdir %s: %s", j->path, strerror(errno));
		return ret;
	}
	fd = open(j->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		snprintf(j->why, sizeof(j->why), "%s: %s", j->path,
			 errno == ELOOP || errno == ENOTDIR ? "not a directory (a link?)"
							    : strerror(errno));
		return ret;
	}
	/* Another user's directory could feed us leases that hold a model
	 * forever, or read who syncs what. */
	if (fstat(fd, &st) < 0 || st.st_uid != geteuid() || (st.st_mode & 077)) {
		snprintf(j->why, sizeof(j->why),
			 "%s is not wexd's own (owner uid %d, mode %03o; wants uid %d, mode 0700)",
			 j->path, (int)st.st_uid, (unsigned)(st.st_mode & 0777), (int)geteuid());
		close(fd);
		return -EPERM;
	}
	j->dirfd = fd;
	j->dev = st.st_dev;
	j->ino = st.st_ino;
	j->nowrite[0] = '\0';
	wex__journal_access(j);
	return 0;
}

int wex__journal_access(struct wex_journal *j)
{
	int was = j->nowrite[0] != '\0';

	/* A read-only mount, or a directory wexd's user may not write (a
	 * mode or an ACL another start left): the leases it holds are read
	 * and held, but none this wexd grants can be written down. */
	if (j->dirfd < 0)
		return 0;
	if (faccessat(j->dirfd, ".", W_OK, AT_EACCESS) < 0)
		snprintf(j->nowrite, sizeof(j->nowrite), "%s", strerror(errno));
	else
		j->nowrite[0] = '\0';
	return was != (j->nowrite[0] != '\0');
}

int wex__journal_open(struct wex_journal *j, const char *socket_path)
{
	struct timespec ts;

	j->dirfd = -1;
	j->why[0] = '\0';
	j->seq = 0;
	j->errors = 0;
	j->keep = 0;
	j->undeleted = 0;
	j->unwritten = 0;
	clock_gettime(CLOCK_REALTIME, &ts);
	instance = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	if ((size_t)snprintf(j->path, sizeof(j->path), "%s.leases", socket_path) >=
	    sizeof(j->path)) {
		snprintf(j->why, sizeof(j->why), "path too long");
		return -ENAMETOOLONG;
	}
	return dir_open(j);
}

const char *wex__journal_moved(const struct wex_journal *j)
{
	struct stat st;

	if (j->dirfd < 0)
		return NULL;
	if (lstat(j->path, &st) < 0)
		return errno == ENOENT ? "removed" : NULL;
	return st.st_dev != j->dev || st.st_ino != j->ino ? "replaced" : NULL;
}

int wex__journal_reopen(struct wex_journal *j)
{
	wex__journal_close(j);
	return dir_open(j);
}

void wex__journal_close(struct wex_journal *j)
{
	if (j->dirfd >= 0)
		close(j->dirfd);
	j->dirfd = -1;
}

static const char *mode_str(int mode)
{
	return mode == WEX_SYNC_REMAP_FIXED ? "remap-fixed" :
	       mode == WEX_SYNC_REMAP_VIEW  ? "remap-view" :
	       mode == WEX_JOURNAL_ROUND    ? "round" :
	       mode == WEX_JOURNAL_LOST     ? "lost" : "copy";
}

/* Writes a whole record (JSON padded with spaces) over the first page:
 * one page-cache copy, so a wexd killed at any point leaves the old
 * record or the new one, and a sync pays one pwrite, not a file creation
 * and a rename. */
static int rec_write(int fd, const char *json)
{
	char page[REC_MAX];
	size_t len = strlen(json);
	ssize_t n;

	if (len >= sizeof(page))
		return -ENAMETOOLONG;
	memcpy(page, json, len);
	memset(page + len, ' ', sizeof(page) - len - 1);
	page[sizeof(page) - 1] = '\n';
	n = pwrite(fd, page, sizeof(page), 0);
	if (n == (ssize_t)sizeof(page))
		return 0;
	return n < 0 ? -errno : -ENOSPC;
}

/* This boot's id (/proc/sys/kernel/random/boot_id), "" if unknown: a
 * record from an earlier boot names pids of processes long gone, which
 * new ones may have taken. */
static const char *boot_id(void)
{
	static char id[40];
	static int read_once;

	if (!read_once) {
		FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");

		read_once = 1;
		if (f) {
			if (!fgets(id, sizeof(id), f))
				id[0] = '\0';
			id[strcspn(id, "\n")] = '\0';
			fclose(f);
		}
	}
	return id;
}

int wex__journal_put(struct wex_journal *j, int *fd, char name[WEX_JOURNAL_NAME_MAX],
		     const struct wex_journal_rec *r)
{
	/* A remap lease of a lost round: its mode, and "lost" (a wexd that
	 * does not know the member holds it as a plain lease). */
	int lost = (r->mode & WEX_JOURNAL_LOST) && r->mode != WEX_JOURNAL_LOST;
	char *s;
	json_t *o;
	int ret;

	if (j->dirfd < 0)
		return -ENOTDIR;
	if (*fd < 0) {
		if (!name[0])
			snprintf(name, WEX_JOURNAL_NAME_MAX, "l-%llu-%llu",
				 (unsigned long long)instance, (unsigned long long)++j->seq);
		*fd = openat(j->dirfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (*fd < 0) {
			/* The name stays: del removes a record left there. */
			ret = -errno;
			j->errors++;
			return ret;
		}
	}
	o = json_pack("{s:i, s:s, s:s, s:I, s:I, s:I, s:s, s:I, s:I, s:I}", "wex_lease", 1,
		      "model", r->model, "group", r->group, "rank", (json_int_t)r->rank, "world",
		      (json_int_t)r->world, "version", (json_int_t)r->version, "mode",
		      mode_str(lost ? r->mode & ~WEX_JOURNAL_LOST : r->mode), "pid",
		      (json_int_t)r->pid, "uid", (json_int_t)r->uid, "start", (json_int_t)r->start);
	if (o && lost)
		json_object_set_new(o, "lost", json_true());
	if (o && boot_id()[0])
		json_object_set_new(o, "boot", json_string(boot_id()));
	s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	ret = s ? rec_write(*fd, s) : -ENOMEM;
	free(s);
	if (ret)
		j->errors++;
	return ret;
}

void wex__journal_clear(struct wex_journal *j, int fd)
{
	int ret;

	if (fd < 0 || j->keep)
		return;
	ret = rec_write(fd, "{\"wex_lease\":0}");
	if (ret) {
		j->errors++;
		wex_warn("journal", "cannot mark a lease ended in %s: %s: should wexd restart before that consumer leaves, the next wexd holds its producer off until the consumer's process calls it, or exits",
			 j->path, strerror(-ret));
	}
}

void wex__journal_del(struct wex_journal *j, int *fd, char name[WEX_JOURNAL_NAME_MAX])
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
	if (!name[0])
		return;
	/* (Named for the first few: a directory wexd cannot write would
	 * otherwise flood the log with one line per stale record at each
	 * start; wexd_held_load counts the rest.) */
	if (j->dirfd >= 0 && !j->keep && unlinkat(j->dirfd, name, 0) < 0 && errno != ENOENT) {
		j->undeleted_err = errno;
		if (j->undeleted++ < 3)
			wex_warn("journal", "cannot remove %s/%s: %m", j->path, name);
	}
	name[0] = '\0';
}

static int mode_parse(const char *s)
{
	if (!strcmp(s, "remap-view"))
		return WEX_SYNC_REMAP_VIEW;
	if (!strcmp(s, "remap-fixed"))
		return WEX_SYNC_REMAP_FIXED;
	if (!strcmp(s, "round"))
		return WEX_JOURNAL_ROUND;
	if (!strcmp(s, "lost"))
		return WEX_JOURNAL_LOST;
	return -1;
}

/* Parses one record; 0 or -EINVAL with why.  *format: its wex_lease; a
 * newer wexd's (above 1) is read as far as this wexd knows the format
 * (0), and one that does not read so is -EPROTO, not -EINVAL. */
static int rec_parse(const char *buf, size_t len, struct wex_journal_rec *r, char *why,
		     size_t wlen, long long *format)
{
	const char *model, *group, *mode, *boot = "";
	json_int_t tag, rank, world, version, pid, uid, start;
	json_error_t je;
	json_t *o = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
	int ret = -EINVAL;

	if (!o) {
		snprintf(why, wlen, "not JSON: %.120s", je.text);
		return -EINVAL;
	}
	*format = json_integer_value(json_object_get(o, "wex_lease"));
	/* Members a newer wexd added are not ours to judge: the lease it
	 * names still holds (a downgrade must not let the producer write
	 * under it).  A record of another format says so in wex_lease. */
	if (json_unpack_ex(o, &je, 0,
			   "{s:I, s:s, s:s, s:I, s:I, s:I, s:s, s:I, s:I, s:I, s?s}", "wex_lease", &tag,
			   "model", &model, "group", &group, "rank", &rank, "world", &world,
			   "version", &version, "mode", &mode, "pid", &pid, "uid", &uid, "start",
			   &start, "boot", &boot) < 0) {
		snprintf(why, wlen, "%.150s", je.text);
		ret = *format > 1 ? -EPROTO : -EINVAL;
		goto out;
	}
	if (tag < 1 || !*model || strlen(model) >= WEX_NAME_MAX || !*group ||
	    strlen(group) >= WEX_NAME_MAX || world < 1 || world > WEX_WORLD_MAX || rank < 0 ||
	    rank >= world || version < 1 || pid < 1 || pid > INT32_MAX || uid < 0 ||
	    uid > UINT32_MAX || start < 0 || strlen(boot) >= sizeof(r->boot) ||
	    (r->mode = mode_parse(mode)) < 0) {
		snprintf(why, wlen, "a field is out of range");
		ret = *format > 1 ? -EPROTO : -EINVAL;
		goto out;
	}
	if ((r->mode == WEX_SYNC_REMAP_VIEW || r->mode == WEX_SYNC_REMAP_FIXED) &&
	    json_is_true(json_object_get(o, "lost")))
		r->mode |= WEX_JOURNAL_LOST;
	snprintf(r->model, sizeof(r->model), "%s", model);
	snprintf(r->group, sizeof(r->group), "%s", group);
	r->rank = (uint32_t)rank;
	r->world = (uint32_t)world;
	r->version = (uint64_t)version;
	r->pid = (pid_t)pid;
	r->uid = (uid_t)uid;
	r->start = (uint64_t)start;
	snprintf(r->boot, sizeof(r->boot), "%s", boot);
	ret = 0;
out:
	json_decref(o);
	return ret;
}

/* A record of a lease that ended, or one whose first write never came
 * (wexd died between creating the file and writing it). */
static int ended(const char *buf, size_t n)
{
	json_t *o;
	int ret;

	if (n == 0)
		return 1;
	o = json_loadb(buf, n, 0, NULL);
	ret = o && json_integer_value(json_object_get(o, "wex_lease")) == 0 &&
	      json_object_size(o) == 1;
	json_decref(o);
	return ret;
}

/* Removes what is no lease record from the journal's directory, saying
 * so; a directory is left (it may hold what someone keeps), named. */
static void drop_stray(struct wex_journal *j, const char *name, const char *why)
{
	if (unlinkat(j->dirfd, name, 0) == 0)
		wex_warn("journal", "%s/%s is not a lease record (%s): removed", j->path, name, why);
	else
		wex_warn("journal", "%s/%s is not a lease record (%s), and cannot be removed (%s): "
			 "left in place, remove it by hand", j->path, name, why, strerror(errno));
}

void wex__journal_scan(struct wex_journal *j,
		       void (*cb)(void *arg, const char *name, const struct wex_journal_rec *r),
		       void *arg)
{
	struct wex_journal_rec r;
	struct dirent *e;
	char buf[REC_MAX + 1], why[160];
	long long format;
	DIR *dir;
	int fd, ret;

	if (j->dirfd < 0)
		return;
	fd = dup(j->dirfd);
	if (fd < 0 || !(dir = fdopendir(fd))) {
		wex_warn("journal", "cannot read %s: %m: leases held before this wexd are unknown",
			 j->path);
		if (fd >= 0)
			close(fd);
		return;
	}
	rewinddir(dir);
	while ((e = readdir(dir))) {
		ssize_t n;
		int rfd, tail;

		if (e->d_name[0] == '.')
			continue;
		/* A record the first journal wrote whole and was to rename
		 * over its name (a wexd killed between): not a lease granted. */
		if (!strncmp(e->d_name, "tmp-", 4)) {
			unlinkat(j->dirfd, e->d_name, 0);
			continue;
		}
		rfd = openat(j->dirfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		if (rfd < 0) {
			snprintf(why, sizeof(why), "%s", strerror(errno));
			drop_stray(j, e->d_name, why);
			continue;
		}
		n = read(rfd, buf, sizeof(buf));
		close(rfd);
		/* A record is its first page: bytes after it (appended by
		 * someone else) do not make a lease that still holds one a
		 * stray, which would let the producer write under it. */
		if (n > REC_MAX && buf[REC_MAX - 1] == '\n') {
			n = REC_MAX;
			tail = 1;
		} else {
			tail = 0;
		}
		if (n < 0 || n > REC_MAX || strlen(e->d_name) >= WEX_JOURNAL_NAME_MAX) {
			snprintf(why, sizeof(why), "%s", n < 0 ? strerror(errno) :
				 n > REC_MAX ? "too long" : "name too long");
		} else if (ended(buf, (size_t)n)) {
			unlinkat(j->dirfd, e->d_name, 0); /* a lease that ended */
			continue;
		} else if ((ret = rec_parse(buf, (size_t)n, &r, why, sizeof(why), &format)) == 0) {
			if (tail)
				wex_warn("journal", "%s/%s has bytes after its record: ignored",
					 j->path, e->d_name);
			/* A newer wexd's (read after a downgrade): the lease
			 * it names holds as far as this wexd reads it. */
			if (format > 1)
				wex_warn("journal", "%s/%s was written by a newer wexd (record format %lld; this wexd's is 1): read as format 1",
					 j->path, e->d_name, format);
			cb(arg, e->d_name, &r);
			continue;
		} else if (ret == -EPROTO) {
			/* Not this wexd's to remove: the newer one reads it. */
			wex_warn("journal", "%s/%s was written by a newer wexd (record format %lld; this wexd's is 1) and cannot be read by this one (%s): left in place; should its process still hold the lease it names, the producer is not held off",
				 j->path, e->d_name, format, why);
			continue;
		}
		drop_stray(j, e->d_name, why);
	}
	closedir(dir);
}

/* Start time and state letter of process pid; 0 if unknown. */
static uint64_t proc_stat(pid_t pid, char *state)
{
	char path[64], buf[1024], *p;
	unsigned long long start = 0;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* The command name may hold spaces and ')': fields start after the
	 * last ')'.  Field 3 (state) follows it; starttime is field 22. */
	p = strrchr(buf, ')');
	if (!p)
		return 0;
	p++;
	while (*p == ' ')
		p++;
	*state = *p;
	for (int field = 3; field <= 22 && p; field++) {
		while (*p == ' ')
			p++;
		if (field == 22) {
			start = strtoull(p, NULL, 10);
			break;
		}
		p = strchr(p, ' ');
	}
	return start;
}

/* Threads and the four uids (real, effective, saved, filesystem) of process
 * pid (/proc/PID/status); 0 and -1s where unknown. */
static long status_of(pid_t pid, long uid[4])
{
	char path[64], line[256];
	long n = 0;
	FILE *f;

	uid[0] = uid[1] = uid[2] = uid[3] = -1;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Threads: %ld", &n) == 1)
			break;
		else
			sscanf(line, "Uid: %ld %ld %ld %ld", &uid[0], &uid[1], &uid[2], &uid[3]);
	fclose(f);
	return n;
}

uint64_t wex__proc_start(pid_t pid)
{
	char state;

	return proc_stat(pid, &state);
}

int wex__journal_alive(const struct wex_journal_rec *r)
{
	char state = '?';
	uint64_t now;
	long uid[4], nthreads;

	if (r->boot[0] && boot_id()[0] && strcmp(r->boot, boot_id()))
		return 0;
	if (kill(r->pid, 0) < 0 && errno == ESRCH)
		return 0;
	now = proc_stat(r->pid, &state);
	nthreads = status_of(r->pid, uid);
	/* Exited, not yet reaped: its mappings are gone, unless only the
	 * leader thread exited and others still run (they share them). */
	if ((state == 'Z' || state == 'X') && nthreads <= 1)
		return 0;
	/* The same pid and start time in this boot: the same process,
	 * whatever its uids are now (one that dropped privileges with
	 * setuid after it connected has none of them the record's). */
	if (r->start && now)
		return now == r->start;
	/* Start time unknown: another user's process took the pid when none
	 * of its uids is the record's, SO_PEERCRED's effective one at
	 * connect.  Any of them (not the effective one alone): a setuid
	 * program's real uid, or a process that changed its effective one
	 * since it connected (a seteuid to drop privileges; its saved uid
	 * stays), is still the lease's. */
	if (uid[0] >= 0 && (uid_t)uid[0] != r->uid && (uid_t)uid[1] != r->uid &&
	    (uid_t)uid[2] != r->uid && (uid_t)uid[3] != r->uid)
		return 0;
	/* Unknown either way (a /proc that hides other users' processes):
	 * the pid alone says it. */
	return 1;
}
