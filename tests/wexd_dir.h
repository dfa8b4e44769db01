/* SPDX-License-Identifier: MIT */
/*
 * wexd_dir.h - removes a test's temporary directory after the wexd that
 * listened in it as DIR/wexd.sock has exited: the socket (a wexd killed
 * without its cleanup leaves it), the lease journal's directory
 * DIR/wexd.sock.leases (a wexd keeps it, empty or not, for the next one:
 * journal.h) and DIR itself.  A journal record left behind (a remap lease
 * still held) keeps the directory, so that a test which left one shows it,
 * unless `wipe` (a test that failed and killed its wexd) removes them.
 */
#ifndef WEX_TESTS_WEXD_DIR_H
#define WEX_TESTS_WEXD_DIR_H

#include <dirent.h>
#include <stdio.h>
#include <unistd.h>

static inline void rm_wexd_dir(const char *dir, int wipe)
{
	char p[512];
	struct dirent *e;
	DIR *d;

	snprintf(p, sizeof(p), "%s/wexd.sock", dir);
	unlink(p);
	/* wexd keeps its lock file on exit, by design. */
	snprintf(p, sizeof(p), "%s/wexd.sock.lock", dir);
	unlink(p);
	snprintf(p, sizeof(p), "%s/wexd.sock.leases", dir);
	if (wipe && (d = opendir(p))) {
		while ((e = readdir(d)))
			if (e->d_name[0] != '.')
				unlinkat(dirfd(d), e->d_name, 0);
		closedir(d);
	}
	rmdir(p);
	rmdir(dir);
}

#endif
