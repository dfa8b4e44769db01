/* SPDX-License-Identifier: MIT */
/*
 * replay.c - main() for a harness built without libFuzzer: runs
 * LLVMFuzzerTestOneInput on every file named on the command line and on
 * every file of every directory named (in name order).  A harness reports a
 * broken promise by aborting, so a pass means every input was parsed or
 * refused as the harness expects.  No input at all is a failure: a test that
 * replays nothing proves nothing.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	size_t len = 0, cap = 0, n;

	if (!f) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	do {
		if (len == cap) {
			uint8_t *b = realloc(buf, cap = cap ? 2 * cap : 4096);

			if (!b) {
				fprintf(stderr, "replay: %s: out of memory\n", path);
				free(buf);
				fclose(f);
				return -1;
			}
			buf = b;
		}
		n = fread(buf + len, 1, cap - len, f);
		len += n;
	} while (n > 0);
	if (ferror(f)) {
		fprintf(stderr, "replay: %s: read error\n", path);
		free(buf);
		fclose(f);
		return -1;
	}
	fclose(f);
	/* A copy of exactly len bytes, so that ASan sees a read past it. */
	uint8_t *in = malloc(len ? len : 1);

	if (!in) {
		free(buf);
		return -1;
	}
	if (len)
		memcpy(in, buf, len);
	free(buf);
	LLVMFuzzerTestOneInput(in, len);
	free(in);
	return 0;
}

int main(int argc, char **argv)
{
	int n = 0;

	for (int i = 1; i < argc; i++) {
		struct dirent **e;
		struct stat st;
		int ne;

		if (stat(argv[i], &st) < 0) {
			fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
			return 1;
		}
		if (!S_ISDIR(st.st_mode)) {
			if (replay_file(argv[i]) < 0)
				return 1;
			n++;
			continue;
		}
		ne = scandir(argv[i], &e, NULL, alphasort);
		if (ne < 0) {
			fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
			return 1;
		}
		for (int k = 0; k < ne; k++) {
			char path[4096];
			int bad = 0;

			snprintf(path, sizeof(path), "%s/%s", argv[i], e[k]->d_name);
			if (e[k]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
				bad = replay_file(path) < 0;
				n++;
			}
			free(e[k]);
			if (bad) {
				while (++k < ne)
					free(e[k]);
				free(e);
				return 1;
			}
		}
		free(e);
	}
	if (n == 0) {
		fprintf(stderr, "replay: no input files\n");
		return 1;
	}
	printf("replayed %d inputs\n", n);
	return 0;
}
