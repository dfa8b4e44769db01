/* SPDX-License-Identifier: MIT */
/*
 * table_budget - proves that wexd bounds the tensor tables it holds for
 * its clients (max_table_bytes, here WEX_MAX_TABLE_BYTES=64 MiB):
 *  - one sealed table memfd of about 20 MiB in wexd, sent by consumers on
 *    four connections (it costs its sender once), is taken three times
 *    and refused the fourth (ENOMEM naming max_table_bytes);
 *  - a producer's register_tensors counts against the same budget;
 *  - what a client leaves (or attaches again without a table) is given
 *    back: a refused connection attaches once another left;
 *  - wexd answers a ping from another client all along.
 *
 * Found by review: every attach and register_tensors copied its table
 * into wexd's heap and kept it, whatever memfd it came in, so one 4 GiB
 * memfd sent on N connections by any user who may consume made wexd
 * allocate N * 4.3 GiB, until the OOM killer took wexd (the largest
 * process) and every trainer's and engine's exchange with it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "helpers.h"
#include "proto.h"

#define NCONS 4
#define BUDGET (64u << 20)

static json_t *rpc(int fd, const char *req, const int *fds, int nfds, const char *code,
		   const char *what)
{
	json_t *r = t_raw_rpc(fd, req, fds, nfds);

	printf("%-46s -> %s: %s\n", what, t_code(r), t_msg(r));
	T_ASSERT(!strcmp(t_code(r), code), "%s: expected %s, got %s (%s)", what, code, t_code(r),
		 t_msg(r));
	return r;
}

static int consumer(const char *sock, int i)
{
	char req[160];
	int fd = t_raw_connect(sock);

	snprintf(req, sizeof(req),
		 "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"big%d\"}", i);
	json_decref(rpc(fd, req, NULL, 0, "OK", "consumer hello"));
	return fd;
}

int main(void)
{
	const char *attach = "{\"v\":1,\"op\":\"attach\",\"device\":\"cpu\"}";
	size_t n = (20u << 20) / sizeof(struct wex_tensor);
	struct wex_tensor *t = calloc(n, sizeof(*t));
	int cons[NCONS], tfd, prod, ping, mfd;
	struct t_wexd d;
	json_t *r;

	T_ASSERT(t, "calloc");
	for (size_t i = 0; i < n; i++)
		t_u8_tensor(&t[i], "w", 1, 0, 0);
	tfd = wex__table_pack(t, NULL, n);
	T_ASSERT(tfd >= 0, "table_pack: %s", strerror(-tfd));
	free(t);
	setenv("WEX_MAX_TABLE_BYTES", "67108864", 1);
	t_wexd_start(&d);
	t_check_backend(d.sock);
	ping = t_raw_connect(d.sock);

	for (int i = 0; i < NCONS; i++) {
		cons[i] = consumer(d.sock, i);
		r = rpc(cons[i], attach, &tfd, 1, i < 3 ? "OK" : "ENOMEM",
			i < 3 ? "attach of ~20 MiB, within the budget" :
				"attach past 64 MiB held (the same memfd)");
		if (i == 3)
			T_ASSERT(strstr(t_msg(r), "max_table_bytes"),
				 "the refusal names max_table_bytes: '%s'", t_msg(r));
		json_decref(r);
		json_decref(rpc(ping, "{\"v\":1,\"op\":\"ping\"}", NULL, 0, "OK", "another client's ping"));
	}

	/* A producer's table counts too. */
	prod = t_raw_connect(d.sock);
	json_decref(rpc(prod, "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"big0\"}",
			NULL, 0, "OK", "producer hello"));
	mfd = memfd_create("t-seg", MFD_CLOEXEC);
	T_ASSERT(mfd >= 0 && ftruncate(mfd, 4096) == 0, "memfd");
	json_decref(rpc(prod, "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"host\",\"size\":4096}",
			&mfd, 1, "OK", "register_segment"));
	close(mfd);
	json_decref(rpc(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "ENOMEM",
			"register_tensors past the budget"));

	/* Given back: a consumer that attaches without a table, one that
	 * leaves. */
	json_decref(rpc(cons[0], attach, NULL, 0, "OK", "attach without a table"));
	json_decref(rpc(prod, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "OK",
			"register_tensors once a layout went"));
	json_decref(rpc(cons[3], attach, &tfd, 1, "ENOMEM", "attach, the budget full again"));
	close(prod);
	close(cons[1]);
	for (double t0 = t_now();; usleep(20000)) {
		r = t_raw_rpc(cons[3], attach, &tfd, 1);
		if (!strcmp(t_code(r), "OK") || t_now() - t0 > 5)
			break;
		json_decref(r);
	}
	printf("%-46s -> %s: %s\n", "attach once a producer and a consumer left", t_code(r), t_msg(r));
	T_ASSERT(!strcmp(t_code(r), "OK"), "the tables of clients that left are still counted: %s",
		 t_msg(r));
	json_decref(r);

	for (int i = 0; i < NCONS; i++)
		if (i != 1)
			close(cons[i]);
	close(ping);
	close(tfd);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
