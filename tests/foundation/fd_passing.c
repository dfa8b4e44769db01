/* SPDX-License-Identifier: MIT */
/*
 * fd_passing - proves the ipc layer's fd passing (no daemon involved):
 * an fd sent with wex_sock_send and received with wex_sock_recv over a
 * SOCK_SEQPACKET socketpair refers to the same memfd (bytes written through
 * one mapping are read through the other); a sealed table survives the
 * round trip byte for byte (wex_table_seal / wex_table_map); an unsealed
 * or half-sealed memfd is refused with -EPERM, an oversized one with
 * -EMSGSIZE; and more fds than WEX_SOCK_MAX_FDS in one message are
 * reported as control truncation with every fd closed (no leak).
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "ipc/sock.h"

static void roundtrip(int a, int b, int *fds, int nfds, int *got, int *ngot, int *mflags)
{
	char buf[64];
	ssize_t n;

	n = wex_sock_send(a, "hi", 2, fds, nfds, 0);
	T_ASSERT(n == 2, "send with %d fds: %s", nfds, n < 0 ? strerror((int)-n) : "short");
	n = wex_sock_recv(b, buf, sizeof(buf), got, WEX_SOCK_MAX_FDS, ngot, mflags, 0);
	T_ASSERT(n == 2 && !memcmp(buf, "hi", 2), "receive: %zd", n);
}

int main(void)
{
	int sp[2], mfd, got[WEX_SOCK_MAX_FDS], ngot = 0, mflags = 0, base, ret;
	struct stat s1, s2;
	char *p1, *p2;
	const void *data;
	size_t len;
	char table[10000];

	T_ASSERT(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) == 0, "socketpair: %s",
		 strerror(errno));
	base = t_fd_count(getpid());

	/* One memfd across: same file, shared bytes. */
	mfd = memfd_create("t-fd", MFD_CLOEXEC);
	T_ASSERT(mfd >= 0 && ftruncate(mfd, 4096) == 0, "memfd");
	roundtrip(sp[0], sp[1], &mfd, 1, got, &ngot, &mflags);
	T_ASSERT(ngot == 1 && !(mflags & MSG_CTRUNC), "one fd received (%d, flags %#x)", ngot, mflags);
	T_ASSERT(got[0] != mfd, "the received fd is a new descriptor");
	T_ASSERT(fstat(mfd, &s1) == 0 && fstat(got[0], &s2) == 0 && s1.st_ino == s2.st_ino &&
			 s1.st_dev == s2.st_dev,
		 "received fd refers to the same file");
	T_ASSERT(fcntl(got[0], F_GETFD) & FD_CLOEXEC, "received fds are close-on-exec");
	p1 = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	p2 = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, got[0], 0);
	T_ASSERT(p1 != MAP_FAILED && p2 != MAP_FAILED, "mmap");
	for (int i = 0; i < 4096; i++)
		p1[i] = (char)(i * 7 + 1);
	for (int i = 0; i < 4096; i++)
		T_ASSERT(p2[i] == (char)(i * 7 + 1), "byte %d written through the sender's fd", i);
	strcpy(p2 + 100, "back");
	T_ASSERT(!memcmp(p1 + 100, "back", 5), "bytes written through the receiver's fd");
	munmap(p1, 4096);
	munmap(p2, 4096);
	close(got[0]);
	close(mfd);

	/* A sealed table round trip. */
	for (size_t i = 0; i < sizeof(table); i++)
		table[i] = (char)(i ^ (i >> 8));
	mfd = wex_table_seal(table, sizeof(table), "t-table");
	T_ASSERT(mfd >= 0, "wex_table_seal: %s", strerror(-mfd));
	roundtrip(sp[0], sp[1], &mfd, 1, got, &ngot, &mflags);
	T_ASSERT(ngot == 1, "table fd received");
	ret = wex_table_map(got[0], 1 << 20, &data, &len);
	T_ASSERT(ret == 0, "wex_table_map of a sealed table: %s", strerror(-ret));
	T_ASSERT(len == sizeof(table) && !memcmp(data, table, len), "table bytes intact");
	wex_table_unmap(data, len);
	T_ASSERT(wex_table_map(got[0], 100, &data, &len) == -EMSGSIZE,
		 "a table above the limit is refused with -EMSGSIZE");
	T_ASSERT(write(got[0], "x", 1) < 0, "a sealed table cannot be written");
	close(got[0]);
	close(mfd);

	/* Unsealed and half-sealed memfds are refused. */
	mfd = memfd_create("t-unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	T_ASSERT(mfd >= 0 && write(mfd, table, 100) == 100, "memfd");
	roundtrip(sp[0], sp[1], &mfd, 1, got, &ngot, &mflags);
	ret = wex_table_map(got[0], 1 << 20, &data, &len);
	T_ASSERT(ret == -EPERM, "an unsealed memfd is refused with -EPERM, got %d", ret);
	T_ASSERT(fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0, "seal");
	ret = wex_table_map(got[0], 1 << 20, &data, &len);
	T_ASSERT(ret == -EPERM, "a memfd not sealed against writes is refused with -EPERM, got %d",
		 ret);
	close(got[0]);
	close(mfd);
	mfd = memfd_create("t-nosealing", MFD_CLOEXEC); /* sealing not even allowed */
	T_ASSERT(mfd >= 0, "memfd");
	T_ASSERT(wex_table_map(mfd, 1 << 20, &data, &len) == -EPERM, "a memfd without sealing: -EPERM");
	close(mfd);

	/* Too many fds for one message: truncation reported, none leaked. */
	{
		int many[100];

		for (int i = 0; i < 100; i++) {
			many[i] = dup(sp[0]);
			T_ASSERT(many[i] >= 0, "dup");
		}
		roundtrip(sp[0], sp[1], many, 100, got, &ngot, &mflags);
		T_ASSERT(mflags & MSG_CTRUNC, "100 fds in one message: MSG_CTRUNC reported (flags %#x)",
			 mflags);
		T_ASSERT(ngot <= WEX_SOCK_MAX_FDS, "at most %d fds kept (%d)", WEX_SOCK_MAX_FDS, ngot);
		wex_sock_close_fds(got, ngot);
		wex_sock_close_fds(many, 100);
	}
	T_ASSERT(t_fd_count(getpid()) == base, "fd count back to %d after all round trips (now %d)",
		 base, t_fd_count(getpid()));
	close(sp[0]);
	close(sp[1]);
	return T_EXIT_PASS;
}
