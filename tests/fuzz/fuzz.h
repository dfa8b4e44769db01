/* SPDX-License-Identifier: MIT */
/*
 * fuzz.h - what the harnesses in tests/fuzz/ share.  Each harness defines
 * LLVMFuzzerTestOneInput and is linked either with libFuzzer (WEX_FUZZ=ON,
 * clang) or with replay.c, whose main() feeds it the files and directories
 * named on its command line (the committed seeds and regressions under
 * tests/fuzz/regress/), so every build runs them as a test.
 */
#ifndef WEX_FUZZ_H
#define WEX_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A broken promise of the code under test: libFuzzer saves the input, the
 * replay test fails. */
#define FZ_ASSERT(cond, ...)                                                         \
	do {                                                                         \
		if (!(cond)) {                                                       \
			fprintf(stderr, "%s:%d: failed: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                \
			fputc('\n', stderr);                                         \
			abort();                                                     \
		}                                                                    \
	} while (0)

/* The input as a NUL-terminated string (malloc'd; it may hold NULs of its
 * own, which end it early for the string parsers). */
static inline char *fz_strdup(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);

	FZ_ASSERT(s, "out of memory");
	for (size_t i = 0; i < size; i++)
		s[i] = (char)data[i];
	s[size] = '\0';
	return s;
}

#endif
